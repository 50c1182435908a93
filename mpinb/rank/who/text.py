"""Words shared by ``%mpi who``'s kinds of value (and the rank's snapshots): a summary clipped to 40 characters,
and sizes as ``64 MB``."""

MB = 1 << 20
SUMMARY = 40  # characters of a summary at most


def clip(text, width=SUMMARY):
    return text if len(text) <= width else text[: width - 1] + "…"


def size_text(nbytes):
    for unit, scale in (("GB", 1 << 30), ("MB", MB), ("kB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes} bytes"
