"""What ``%mpi status`` says of a world: one state per rank (idle, busy, dead), and a summary of where the
ranks run."""

import logging

from ...wire.ranks import label_ranks
from . import ipp
from .reaper import alive

log = logging.getLogger("mpinb")


def rank_states(world):
    """One row per rank: ``{"rank", "host", "pid", "threads", "state"}``, state being idle, busy or dead."""
    queues = {}
    alive_ids = set(world.client.ids) if world.running else set()
    asked = [eid for eid in world.engines.values() if eid in alive_ids]
    if asked and _controller_alive(world):
        try:
            queues = world.client.queue_status(targets=asked)
        except Exception as exc:  # noqa: BLE001 - engines unregistering as we ask: show them as they are
            log.debug("queue_status: %s", exc)
    rows = []
    dead = set(world.dead_ranks())
    for rank in world.ranks:
        who = world.identities[rank]
        eid = world.engines[rank]
        if eid not in alive_ids or rank in dead:
            state = "dead"
        else:
            # the hub counts a request until it has seen the reply, later than this client: with nothing
            # outstanding here, a count left is that lag (mpinb's own cells do not go through the hub)
            queued = queues.get(eid, {}).get("queue", 0) and world.client.outstanding
            state = "busy" if queued else "idle"
        rows.append({"rank": rank, "host": who["host"], "pid": who["pid"], "threads": who.get("threads") or "-",
                     "state": state})
    return rows

def describe(world):
    """A summary: size, MPI library, mpiexec, the batch job if any, and which ranks run on which host."""
    if not world.engines:
        return "no MPI world is running"
    mpi = world.identities[world.ranks[0]]["mpi"]
    via = world.mpi.mpiexec if world.mpi is not None else "mpiexec"
    line = f"MPI world of {world.size} rank{'s' if world.size != 1 else ''} ({mpi}) via {via}"
    where = world.launcher.describe(job_id=world.job_id())
    if where:
        line += f" in {where}" if world.launcher.batch else f" on {where}"
    left = world.launcher.time_left()
    if left:
        line += f", {left}"
    if not world.loopback:
        line += f"; controller on {world.ip}"
    hosts = world.hosts()
    return line + "\n" + "; ".join(f"{host}: {label_ranks(ranks)}" for host, ranks in hosts.items())


def _controller_alive(world):
    process = ipp.process(world.cluster.controller)
    return process is None or alive(process)
