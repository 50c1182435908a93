"""Before a data-parallel collective, every rank checks that the others hold the same parameters and arguments: one
small allgather when all is well, an error on every rank naming the parameters and ranks that differ when not.
A trace shows these allgathers as mpinb's own (kind ``"mpinb"``), not as the user's collectives."""

import zlib

from ..tracing import own_check


def parameter_signature(named, *, grads=True):
    """What every rank must agree on: name, shape, dtype and (with *grads*) whether it holds a gradient."""
    return [(name, tuple(p.shape), str(p.dtype), p.grad is not None if grads else True) for name, p in named]


def signature_digest(signature):
    return zlib.crc32(repr(signature).encode())


def agree(comm, what, signature, *, problem=None, same=None):
    """Raise on every rank, naming parameters and ranks, unless every rank has this *signature*, no rank found a
    *problem* (an exception to raise) with its input, and every rank has the same values in *same*
    (``{"root": 0}``). One small allgather when all is well."""
    from ...wire.ranks import label_ranks

    own_problem = None if problem is None else (type(problem), str(problem))
    with own_check(what):
        everyone = comm.allgather((signature_digest(signature), own_problem, same or {}))
    problems = {}
    for rank, (_, found, _) in enumerate(everyone):
        if found is not None:
            problems.setdefault(found, []).append(rank)
    if problems:
        kind = next(iter(problems))[0]
        if len(problems) == 1 and len(next(iter(problems.values()))) == comm.size:
            raise kind(f"{what}: {next(iter(problems))[1]}")
        raise kind(f"{what}: " + "; ".join(f"on {label_ranks(ranks)}: {message}"
                                          for (_, message), ranks in problems.items()))
    for key in everyone[0][2]:
        values = {}
        for rank, (_, _, held) in enumerate(everyone):
            values.setdefault(repr(held[key]), []).append(rank)
        if len(values) > 1:
            raise ValueError(f"{what}: ranks disagree on the {key}: "
                             + "; ".join(f"{value} on {label_ranks(ranks)}" for value, ranks in values.items()))
    if len({digest for digest, _, _ in everyone}) == 1:
        return
    with own_check(what):
        everyone = comm.allgather(signature)
    by_name = [{name: rest for name, *rest in rank_signature} for rank_signature in everyone]
    names = list(dict.fromkeys(name for rank_signature in everyone for name, *_ in rank_signature))
    problems = []
    for name in names:
        variants = {}
        for rank, held in enumerate(by_name):
            variants.setdefault(tuple(held[name]) if name in held else None, []).append(rank)
        if len(variants) == 1:
            continue
        grads_differ = len({v[2] for v in variants if v is not None}) > 1
        described = []
        for variant, ranks in variants.items():
            if variant is None:
                described.append(f"missing on {label_ranks(ranks)}")
            else:
                shape, dtype, has_grad = variant
                grad = (", gradient" if has_grad else ", no gradient") if grads_differ else ""
                described.append(f"{tuple(shape)} {dtype.removeprefix('torch.')}{grad} on {label_ranks(ranks)}")
        hint = " (not used in that rank's forward pass?)" if grads_differ else ""
        problems.append(f"parameter {name!r}: " + "; ".join(described) + hint)
    raise ValueError(f"{what}: ranks disagree on {len(problems)} parameter(s): " + " | ".join(problems))
