"""What travels between the notebook and the ranks, and what both sides agree on: the signed, numbered
messages of the cell channel, shared-memory segments, rank-set notation."""
