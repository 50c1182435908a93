"""The debuggers of ``%%mpi`` cells, the kernel's end: JupyterLab's debugger panel on a chosen rank, in front of
the kernel's own debugger."""

from . import visual_debugger

__all__ = ["visual_debugger"]
