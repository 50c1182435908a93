"""Keep one marked section of benchmarks/RESULTS.md current: each benchmark script rewrites only its own table."""

from pathlib import Path


def shell():
    """A real IPython shell with mpinb loaded, as a user gets it from ``%load_ext mpinb``."""
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "mpinb")
    return ip


def publish(table, path, mark):
    """Print *table*; with a *path*, also put it (it begins and ends with the line *mark*) in place of the section
    *mark* encloses in that file, or append it when there is none yet."""
    print(table)
    if not path:
        return
    text = Path(path).read_text()
    if mark in text:
        before, _, rest = text.partition(mark)
        text = before + table + rest.partition(mark)[2]
    else:
        text = text.rstrip("\n") + "\n\n" + table + "\n"
    Path(path).write_text(text)
