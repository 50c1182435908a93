"""The debuggers on a rank: pdb with its prompt in the notebook (post-mortem and ``breakpoint()``), the rank's end of
JupyterLab's debugger panel, and the rank's native stack read by py-spy on its own host."""
