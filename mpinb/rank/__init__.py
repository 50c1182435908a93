"""Code that runs on the ranks only: no IPython widgets, no notebook needed."""
