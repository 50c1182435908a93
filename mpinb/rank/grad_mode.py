"""torch's grad mode put back when a Stop lands in torch's own code.

torch turns grad mode off and on again around its own work: ``optimizer.step()`` runs with it off and turns it
back on in a ``finally``. A Stop raised there, before the mode is back, leaves it off on that rank alone for the
rest of the session: the rank's next training step fails (``element 0 of tensors does not require grad``) while
the other ranks wait for it in the gradient reduction. A cell stopped inside torch's code gets back the mode it
began with; one stopped in the user's code keeps what that code set (``torch.set_grad_enabled(False)`` in a cell)."""

import os
import sys


def at_start():
    """The grad mode a cell begins with (torch's default, on, where torch is not imported yet)."""
    torch = sys.modules.get("torch")
    return True if torch is None else torch.is_grad_enabled()


def after_stop(exc, mode):
    """*exc* ended the cell: where it is a Stop raised in torch's own code and the grad mode is no longer *mode*
    (what :func:`at_start` said), put *mode* back."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(exc, KeyboardInterrupt) or exc.__traceback__ is None:
        return
    if torch.is_grad_enabled() == mode:
        return
    tb = exc.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    if tb.tb_frame.f_code.co_filename.startswith(os.path.dirname(torch.__file__) + os.sep):
        torch.set_grad_enabled(mode)
