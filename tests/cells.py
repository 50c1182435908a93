"""Cells several test files run on the ranks."""

# ranks 0 and 1 wait for each other in a recv: a deadlock mpinb must diagnose and get out of
DEADLOCK = """\
x = 1
if rank == 0:
    comm.recv(source=1)
elif rank == 1:
    comm.recv(source=0)
"""
