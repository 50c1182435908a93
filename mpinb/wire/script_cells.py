"""The one-line cell ``%mpi run`` sends to run a script on every rank (``rank/run_script.py`` runs it), and how
the notebook knows a cell for one when it says where a rank is (``notebook/diagnosis/diagnose.py``)."""

import ast


def cell(path, args):
    """The one-line cell ``%mpi run`` sends: :func:`mpinb.rank.run_script.run` of *path* with *args* on every rank."""
    return f'{_CALL}({path!r}, {list(args)!r})'


def script_in(code):
    """The path of the script *code* runs, when it is a :func:`cell`, else ``None``."""
    if not code.startswith(_CALL + "("):
        return None
    try:
        call = ast.parse(code, mode="eval").body
        return ast.literal_eval(call.args[0])
    except (SyntaxError, ValueError, AttributeError, IndexError):
        return None


_CALL = '__import__("mpinb.rank.run_script", fromlist=["run"]).run'
