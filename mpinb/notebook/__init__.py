"""The notebook side: the magics, a world's lifecycle, running a cell and what comes back from it."""
