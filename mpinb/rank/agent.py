"""The rank end of the cell channel: cells arrive on the engine's event loop, output and replies leave in order.

Started once per rank when the world starts. Cells are received by the engine's main thread (its IOLoop), so
user code runs where ipyparallel would run it, with the same namespace. Everything going back — output chunks,
coalesced every ``flush_interval`` seconds, ``mpinb.report()`` records, drained every ``report_interval``
seconds, then the cell's reply — leaves through one outbox thread and one socket (``rank/outbox.py``), so a
reply never overtakes its cell's output or metrics.
"""

import dataclasses
import signal
import sys

import numpy as np
import zmq

from ..wire import messages, rank_files, shm
from ..wire.gathered import AllRanks, InFrames, InSegment, ViaRoot
from ..wire.kinds import Cell, CellReply, Hello, Kept, Reply
from . import gather, outbox, replicas, report, rollcall, runner, snapshots, stacks, tracing
from .tracing import torch_hooks, trace_torch
from .debug import post_mortem as debug, visual_debugger
from .abort_watch import AbortWatch
from .native_output import NativeOutput
from .outbox import Ask, BetweenCells, ChannelStream, Outbox, Output, Send, TraceEnd, TraceStart, readable

_agent = None


def start(*, cells, events, salt, key=None, encrypt=False, bulk=None, rank=None, flush_interval=0.05):
    """Connect this rank to the notebook's channel (again, if it was); called through ipyparallel on every rank.
    The channel's key is derived from *salt* and the engine's ipyparallel session key (``messages.derive_key``),
    unless ipyparallel runs CurveZMQ without one and sent *key* encrypted; with *encrypt*, the sockets are
    CurveZMQ clients of the server key derived from it, and large messages go sealed to *bulk* (``wire/bulk.py``)."""
    global _agent
    from IPython import get_ipython

    key = key or messages.derive_key(get_ipython().kernel.session.key, salt)
    if rank is None:
        from mpi4py import MPI

        rank = MPI.COMM_WORLD.rank
    if _agent is not None:
        _agent.close()
    _agent = Agent(cells=cells, events=events, key=key, rank=rank, flush_interval=flush_interval,
                   encrypt=encrypt, bulk=bulk)
    return rank


class Agent:
    def __init__(self, *, cells, events, key, rank, flush_interval, encrypt=False, bulk=None):
        from tornado.ioloop import IOLoop

        self.key, self.rank = key, rank
        self.verifier = messages.Verifier(key)
        # replies are packed here and sent by the outbox in order: a stream of their own
        self.hello = messages.Signer(key, f"rank/{rank}/inbox")
        self.replies = messages.Signer(key, f"rank/{rank}/replies")
        self.segments = None  # shared memory for gathers (shm.Pool), made on the first one that needs it
        context = zmq.Context.instance()
        self.inbox = context.socket(zmq.DEALER)
        self.inbox.setsockopt(zmq.IDENTITY, str(rank).encode())
        self.inbox.setsockopt(zmq.LINGER, 0)
        if encrypt:
            messages.encrypt_client(self.inbox, key)
        self.inbox.connect(cells)
        self.outbox = Outbox(context, events, key, rank, flush_interval, encrypt, bulk)
        self.engine_streams = sys.stdout, sys.stderr
        sys.stdout = BetweenCells(self.outbox, "stdout", sys.stdout)
        sys.stderr = BetweenCells(self.outbox, "stderr", sys.stderr)
        report.recorder.sink = self.outbox.metrics
        # the engine's loop wakes this rank when a cell arrives: on the socket's descriptor, which signals that
        # its state changed (edge-like), so every wake-up reads until nothing is left (ZMQStream, which did
        # this with more bookkeeping, cost each cell about a tenth of a millisecond more)
        self.loop, self.inbox_fd = IOLoop.current(), self.inbox.getsockopt(zmq.FD)
        self.loop.add_handler(self.inbox_fd, self._on_readable, IOLoop.READ)
        self.loop.add_callback(self._on_readable)  # what arrived before the handler was there
        path = stacks.install()
        paths = stacks.keep_native_output()
        tracing.state.mirror_to(rank_files.ledger_path(path))
        torch_hooks.install_when_imported()
        self.abort_watch = AbortWatch(self.outbox)
        self.rollcall = rollcall.RollCall(context, cells, key, rank, encrypt=encrypt)
        self.native = None if paths is None else NativeOutput(paths, self._native_output)
        outbox.before_write = self.native.drain if self.native is not None else None
        self.cell_id = None
        debug.install(lambda prompt: self.outbox.put(Ask(self.cell_id, prompt)), rank)
        visual_debugger.install(lambda message: self.outbox.put(Send(message)), rank)
        self.snapshots = snapshots.install(rank)
        if self.snapshots is not None:  # the notebook may wait for every rank's snapshot (snapshot_lag = 0)
            self.snapshots.on_taken = lambda cell: self.outbox.put(Send(Kept(rank, cell)))
        self.inbox.send_multipart(self.hello.pack(Hello(rank, path)))

    def _native_output(self, name, text):
        """What the rank wrote below Python: the running cell's output, or shown with the next one."""
        self.outbox.put(Output(self.rollcall.cell, name, readable(text)))

    def _on_readable(self, *_):
        while not self.inbox.closed:
            try:
                frames = self.inbox.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._on_message(frames)

    def _on_message(self, frames):
        message = self.verifier.unpack(frames)
        if not isinstance(message, Cell):
            return
        cell_id, code, number, options = message
        # a call of mpinb's own (who, grads, a flush before a restart) reads the namespace and leaves the pending
        # snapshot of the user's last cell be; a restore changes it, and is kept as a cell is
        keeps = options.call is None or snapshots.changes_namespace(options.call)
        self._before(cell_id, options, keeps)
        streams = sys.stdout, sys.stderr
        sys.stdout = ChannelStream(self.outbox, cell_id, "stdout", streams[0])
        sys.stderr = ChannelStream(self.outbox, cell_id, "stderr", streams[1])
        # the kernel ignores SIGINT between requests; while a cell runs, SIGINT must interrupt it
        sigint = signal.signal(signal.SIGINT, signal.default_int_handler)
        buffers = []
        written = stacks.native_stderr_size()
        counts = tracing.state.counts()
        try:
            if options.call is not None:
                reply = runner.call(options.call)
            else:
                reply = runner.execute(code, number=number, source=options.source, debug=options.debug)
            tracing.state.outstanding.clear()  # the cell is over: this rank waits for nothing it launched
            # checked against the other ranks' in the notebook: a mismatch MPI let pass is still a mismatch
            reply.collectives = (tracing.state.counts(), tracing.state.changed(counts))
            if replicas.watched and reply.error is None:  # models meant to be the same on every rank
                reply.replicas = replicas.fingerprints(runner.user_namespace())
            if options.gather is not None:
                reply.gathered, buffers = self._gather(options.gather)
        except BaseException as exc:  # noqa: BLE001 - a cell always gets its reply, or the notebook waits forever
            reply, buffers = CellReply(error=runner.describe_error(exc)), []
        finally:
            signal.signal(signal.SIGINT, sigint)
            if options.call is None:
                stacks.rearm()  # the user's code may have taken the stack-dump and crash handlers away
            sys.stdout, sys.stderr = streams
            trace_torch.release_retired()
        if self.native is not None:  # the cell's output below Python comes before its reply
            self.native.drain(flush=True)
        self.rollcall.cell = None
        self.abort_watch.end_if_aborted(written)  # a cell that called MPI_Abort never replies
        if tracing.state.spans is not None:
            spans, dropped = tracing.state.drain()
            tracing.state.stop()
            self.outbox.put(TraceEnd(cell_id, spans, dropped))
        self.outbox.reply(self._pack_reply(cell_id, reply, buffers))
        if self.snapshots is not None and reply.error is None and keeps:
            if options.settings is not None:
                self.snapshots.complete = options.settings.complete
            self.snapshots.after_cell(cell_id, runner.user_namespace())

    def _before(self, cell_id, options, keeps):
        """What a cell's request sets up before it runs: the last cell's snapshot finished (when this one may change
        the namespace), the gathered memory the notebook released let go, the user's settings, the cell's id, and
        its trace."""
        if self.snapshots is not None and keeps:
            # the last cell's: never of a namespace a cell is changing
            self.snapshots.wait(due=options.settings is not None and options.settings.snapshot_due)
        if self.segments is not None and self.rank in options.released:
            self.segments.release(options.released[self.rank])
        if options.settings is not None:  # else a call of mpinb's own: the user's settings stay
            self.outbox.report_interval = options.settings.report_interval
            self.rollcall.after = options.settings.collective_wait
        self.rollcall.cell = self.cell_id = visual_debugger.cell_id = cell_id
        if options.trace:
            tracing.state.start(options.trace_buffer or tracing.BUFFER)
            self.outbox.put(TraceStart(cell_id))

    def _gather(self, request):
        """Pack the names of *request* (a ``GatherRequest``) for the notebook: into a shared-memory segment when
        asked, else as raw frames."""
        items, buffers = gather.collect(list(request.names), runner.user_namespace(), stats=request.stats)
        if request.transport == "mpi":
            return self._gather_over_mpi(items, buffers, request.root)
        dropped = tuple(self.segments.take_dropped()) if self.segments is not None else ()
        if request.transport == "shm" and buffers:
            try:
                if self.segments is None:
                    self.segments = shm.Pool()
                lease, path, offsets = self.segments.write(buffers)
                return InSegment(items, path, lease, tuple(offsets),
                                 dropped + tuple(self.segments.take_dropped())), []
            except OSError as exc:  # no shared memory, or not enough: the channel always works
                dropped += tuple(self.segments.take_dropped())
                return InFrames(items, dropped, f"shared memory failed ({exc})"), buffers
        return InFrames(items, dropped), buffers

    def _gather_over_mpi(self, items, buffers, root):
        """Every rank's packed values to *root* by one MPI gather (pickle 5, buffers out of band); *root* sends
        them all to the notebook as frames of one message. For ranks that do not share the notebook's host."""
        from mpi4py import MPI
        from mpi4py.util import pkl5

        arrays = [np.frombuffer(buffer, dtype=np.uint8) for buffer in buffers]
        everyone = pkl5.Intracomm(MPI.COMM_WORLD).gather((self.rank, items, arrays), root=root)
        if everyone is None:
            return ViaRoot(root), []
        by_rank, frames = {}, []
        for rank, rank_items, rank_arrays in everyone:
            by_rank[rank] = rank_items
            frames.extend(memoryview(array) for array in rank_arrays)
        return AllRanks(by_rank), frames

    def _pack_reply(self, cell_id, reply, buffers=()):
        """Pickle the reply once, here on the main thread (the next cell cannot change the value meanwhile)."""
        try:
            return self.replies.pack(Reply(self.rank, cell_id, reply), buffers)
        except Exception:  # noqa: BLE001 - anything pickle raises means "cannot travel": send its repr instead
            reply = dataclasses.replace(reply, value=runner.stand_in(reply.value))
            try:
                return self.replies.pack(Reply(self.rank, cell_id, reply), buffers)
            except Exception as exc:  # noqa: BLE001 - even the stand-in failed: say so rather than stay silent
                error = runner.describe_error(exc)
                return self.replies.pack(Reply(self.rank, cell_id, CellReply(error=error)))

    def close(self):
        sys.stdout, sys.stderr = self.engine_streams
        outbox.before_write = None
        if self.native is not None:
            self.native.close()
        self.loop.remove_handler(self.inbox_fd)
        self.inbox.close()
        self.rollcall.close()
        self.outbox.close()
        if self.segments is not None:
            self.segments.close()
