"""Where a rank stopped in the visual debugger's panel waits, known from its stack: the rank's end of that debugger
(``rank/debug/visual_debugger.py``) waits for the panel's next request in :data:`WAITING_FUNCTION` of
:data:`WAITING_FILE`, and the notebook (``notebook/cell/rank_errors.py``) says of a rank it interrupted there that it
was paused in the debugger, not running its cell."""

import os

WAITING_FILE = os.path.join("mpinb", "rank", "debug", "visual_debugger.py")
WAITING_FUNCTION = "next_request"


def paused_in(frames):
    """Whether a rank whose stack is *frames* (``(file, line, function)``, as ``rank/stacks.py`` dumps them) waits
    in the visual debugger for the panel: what the notebook says of a rank it stopped there."""
    return any(file.endswith(WAITING_FILE) and function == WAITING_FUNCTION for file, _, function in frames)
