"""The rank end of the cell channel: cells arrive on the engine's event loop, output and replies leave in order.

Started once per rank when the world starts. Cells are received by the engine's main thread (its IOLoop), so
user code runs where ipyparallel would run it, with the same namespace. Everything going back — output chunks,
coalesced every ``flush_interval`` seconds, ``mpinb.report()`` records, drained every ``report_interval``
seconds, then the cell's reply — leaves through one outbox thread and one socket, so a reply never overtakes
its cell's output or metrics.
"""

import enum
import io
import os
import queue
import signal
import sys
import threading
import time
from dataclasses import dataclass

import numpy as np
import zmq

from ..wire import messages, shm
from ..wire.kinds import Cell, Hello, Input, Metrics, Out, Reply, TraceSpans
from . import debug, gather, report, rollcall, runner, stacks, trace_torch, tracing

_agent = None


class Wake(enum.Enum):
    """What the outbox thread is woken for when it is not handed an item to send."""

    TICK = "a deadline passed: output or metrics may be due"
    METRICS = "mpinb.report() has records waiting"
    CLOSE = "send what is left and close"


@dataclass(frozen=True, slots=True)
class Output:
    """Text a cell wrote to ``stdout`` or ``stderr``; coalesced with the text after it before it is sent."""

    cell_id: str
    stream: str
    text: str


@dataclass(frozen=True, slots=True)
class Packed:
    """A cell's reply, signed and packed, to send after everything queued before it."""

    frames: list


@dataclass(frozen=True, slots=True)
class TraceStart:
    """A traced cell began: send its spans every ``report_interval`` seconds while it runs."""

    cell_id: str


@dataclass(frozen=True, slots=True)
class TraceEnd:
    """A traced cell ended: its last spans, after its output."""

    cell_id: str
    spans: list
    dropped: int


@dataclass(frozen=True, slots=True)
class Ask:
    """A debugger's prompt, sent after the output written before it."""

    cell_id: str
    prompt: str


def start(*, cells, events, salt, key=None, encrypt=False, rank=None, flush_interval=0.05):
    """Connect this rank to the notebook's channel (again, if it was); called through ipyparallel on every rank.
    The channel's key is derived from *salt* and the engine's ipyparallel session key (``messages.derive_key``),
    unless ipyparallel runs CurveZMQ without one and sent *key* encrypted; with *encrypt*, the sockets are
    CurveZMQ clients of the server key derived from it."""
    global _agent
    from IPython import get_ipython

    key = key or messages.derive_key(get_ipython().kernel.session.key, salt)
    if rank is None:
        from mpi4py import MPI

        rank = MPI.COMM_WORLD.rank
    if _agent is not None:
        _agent.close()
    _agent = Agent(cells=cells, events=events, key=key, rank=rank, flush_interval=flush_interval,
                   encrypt=encrypt)
    return rank


class Agent:
    def __init__(self, *, cells, events, key, rank, flush_interval, encrypt=False):
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
        self.outbox = Outbox(context, events, key, rank, flush_interval, encrypt)
        report.recorder.sink = self.outbox.metrics
        # the engine's loop wakes this rank when a cell arrives: on the socket's descriptor, which signals that
        # its state changed (edge-like), so every wake-up reads until nothing is left (ZMQStream, which did
        # this with more bookkeeping, cost each cell about a tenth of a millisecond more)
        self.loop, self.inbox_fd = IOLoop.current(), self.inbox.getsockopt(zmq.FD)
        self.loop.add_handler(self.inbox_fd, self._on_readable, IOLoop.READ)
        self.loop.add_callback(self._on_readable)  # what arrived before the handler was there
        path = stacks.install()
        stacks.keep_native_stderr()
        tracing.state.mirror_to(stacks.ledger_path(path))
        trace_torch.install_when_imported()
        self.abort_watch = AbortWatch(self.outbox)
        self.rollcall = rollcall.RollCall(context, cells, key, rank, encrypt=encrypt)
        self.cell_id = None
        debug.install(lambda prompt: self.outbox.put(Ask(self.cell_id, prompt)), rank)
        self.inbox.send_multipart(self.hello.pack(Hello(rank, path)))

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
        if self.segments is not None and self.rank in options.get("released", {}):
            self.segments.release(options["released"][self.rank])
        self.outbox.report_interval = options.get("report_interval", self.outbox.report_interval)
        self.rollcall.after = options.get("collective_wait", self.rollcall.after)
        self.rollcall.cell = self.cell_id = cell_id
        if options.get("trace"):
            tracing.state.start(options.get("trace_buffer", tracing.BUFFER))
            self.outbox.put(TraceStart(cell_id))
        streams = sys.stdout, sys.stderr
        sys.stdout = ChannelStream(self.outbox, cell_id, "stdout", streams[0])
        sys.stderr = ChannelStream(self.outbox, cell_id, "stderr", streams[1])
        # the kernel ignores SIGINT between requests; while a cell runs, SIGINT must interrupt it
        sigint = signal.signal(signal.SIGINT, signal.default_int_handler)
        buffers = []
        written = stacks.native_stderr_size()
        counts = tracing.state.counts()
        try:
            if "call" in options:
                reply = runner.call(options["call"])
            else:
                reply = runner.run_cell(code, number=number, source=options.get("source"))
            # checked against the other ranks' in the notebook: a mismatch MPI let pass is still a mismatch
            reply["collectives"] = (tracing.state.counts(), tracing.state.changed(counts))
            if options.get("gather"):
                reply["gathered"], buffers = self._gather(options["gather"], options)
        except BaseException as exc:  # noqa: BLE001 - a cell always gets its reply, or the notebook waits forever
            reply, buffers = {"error": runner.describe_error(exc)}, []
        finally:
            signal.signal(signal.SIGINT, sigint)
            sys.stdout, sys.stderr = streams
        self.rollcall.cell = None
        self.abort_watch.end_if_aborted(written)  # a cell that called MPI_Abort never replies
        if tracing.state.spans is not None:
            spans, dropped = tracing.state.drain()
            tracing.state.stop()
            self.outbox.put(TraceEnd(cell_id, spans, dropped))
        self.outbox.reply(self._pack_reply(cell_id, reply, buffers))

    def _gather(self, names, options):
        """Pack *names* for the notebook: into a shared-memory segment when asked, else as raw frames."""
        items, buffers = gather.collect(names, runner.user_namespace(), stats=options.get("stats", True))
        if options.get("transport") == "mpi":
            return self._gather_over_mpi(items, buffers, options.get("root", 0))
        dropped = self.segments.take_dropped() if self.segments is not None else []
        if options.get("transport") == "shm" and buffers:
            try:
                if self.segments is None:
                    self.segments = shm.Pool()
                lease, path, offsets = self.segments.write(buffers)
                return {"items": items, "transport": "shm", "path": path, "lease": lease, "offsets": offsets,
                        "dropped": dropped + self.segments.take_dropped()}, []
            except OSError as exc:  # no shared memory, or not enough: the channel always works
                dropped += self.segments.take_dropped()
                return {"items": items, "transport": "frames", "note": f"shared memory failed ({exc})",
                        "dropped": dropped}, buffers
        return {"items": items, "transport": "frames", "dropped": dropped}, buffers

    def _gather_over_mpi(self, items, buffers, root):
        """Every rank's packed values to *root* by one MPI gather (pickle 5, buffers out of band); *root* sends
        them all to the notebook as frames of one message. For ranks that do not share the notebook's host."""
        from mpi4py import MPI
        from mpi4py.util import pkl5

        arrays = [np.frombuffer(buffer, dtype=np.uint8) for buffer in buffers]
        everyone = pkl5.Intracomm(MPI.COMM_WORLD).gather((self.rank, items, arrays), root=root)
        if everyone is None:
            return {"transport": "via", "root": root}, []
        by_rank, frames = {}, []
        for rank, rank_items, rank_arrays in everyone:
            by_rank[rank] = rank_items
            frames.extend(memoryview(array) for array in rank_arrays)
        return {"transport": "frames", "by_rank": by_rank}, frames

    def _pack_reply(self, cell_id, reply, buffers=()):
        """Pickle the reply once, here on the main thread (the next cell cannot change the value meanwhile)."""
        try:
            return self.replies.pack(Reply(self.rank, cell_id, reply), buffers)
        except Exception:  # noqa: BLE001 - anything pickle raises means "cannot travel": send its repr instead
            reply = dict(reply, value=runner.stand_in(reply.get("value")))
            try:
                return self.replies.pack(Reply(self.rank, cell_id, reply), buffers)
            except Exception as exc:  # noqa: BLE001 - even the stand-in failed: say so rather than stay silent
                error = runner.describe_error(exc)
                return self.replies.pack(Reply(self.rank, cell_id, {"error": error}))

    def close(self):
        self.loop.remove_handler(self.inbox_fd)
        self.inbox.close()
        self.rollcall.close()
        self.outbox.close()
        if self.segments is not None:
            self.segments.close()


class AbortWatch(threading.Thread):
    """Ends this process as MPI_Abort should have, when MPI wrote its abort notice but the process lives on.

    MPICH has been seen, now and then on a busy machine, to let ``MPI_Abort`` return to its caller, which then
    went on (or hung in the next collective) as if nothing had happened (in JupyterLab, in 2 runs of 2 of one
    notebook here). The notice is in the rank's own stderr file at once (``rank/stacks.py``): a cell that wrote one
    ends its rank instead of replying, and a second after one, a rank still running exits with the code.
    """

    def __init__(self, outbox, every=0.1, grace=1.0):
        super().__init__(name="mpinb-abort-watch", daemon=True)
        self.outbox, self.every, self.grace = outbox, every, grace
        self.seen = stacks.native_stderr_size()
        self.start()

    def run(self):
        while True:
            time.sleep(self.every)
            size = stacks.native_stderr_size()
            if size != self.seen:
                notices = stacks.aborts(stacks.native_stderr_since(self.seen))
                self.seen = size
                if notices:
                    time.sleep(self.grace)  # MPI's own abort normally ends the process first
                    self._exit(notices)

    def end_if_aborted(self, since):
        """Exit now if MPI wrote an abort notice after *since* bytes (the cell that called it has returned)."""
        if stacks.native_stderr_size() <= since:  # nothing written: no file to open and read
            return
        notices = stacks.aborts(stacks.native_stderr_since(since))
        if notices:
            self._exit(notices)

    def _exit(self, notices):
        self.outbox.close()  # what the cell printed still reaches the notebook
        os._exit(notices[0][2] or 1)


class ChannelStream(io.TextIOBase):
    """``sys.stdout``/``sys.stderr`` while a cell runs: text goes to the outbox, tagged with the cell."""

    def __init__(self, outbox, cell_id, name, original):
        self.outbox, self.cell_id, self.name, self.original = outbox, cell_id, name, original

    @property
    def encoding(self):
        return "utf-8"

    def writable(self):
        return True

    def write(self, text):
        if text:
            self.outbox.put(Output(self.cell_id, self.name, str(text)))
            if self.name == "stderr":
                stacks.note_stderr(str(text))
        return len(text)

    def fileno(self):
        return self.original.fileno()


class Outbox(threading.Thread):
    """Owns the socket back to the notebook; sends output chunks in batches and replies at once, in order.

    A reply is sent by the thread that made it, when everything put before it has been handled (a trivial cell
    then wakes no second thread); otherwise it queues behind what is still waiting. The socket is used under
    ``lock`` only, by one thread at a time.
    """

    def __init__(self, context, address, key, rank, flush_interval, encrypt=False):
        super().__init__(name="mpinb-outbox", daemon=True)
        self.rank = rank
        self.signer = messages.Signer(key, f"rank/{rank}/outbox")
        self.flush_interval = flush_interval
        self.report_interval = 0.1  # each cell sends the notebook's setting
        self.tracing = None  # the id of the traced cell running, if one is
        self.queue = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.unhandled = 0  # items put and not yet handled by this thread
        self.pending, self.due, self.metrics_due = [], None, None  # output waiting; when output, metrics are sent
        self.closed = False
        self.metrics = report.AgentSink(notify=lambda: self.put(Wake.METRICS))
        self.socket = context.socket(zmq.PUSH)
        self.socket.setsockopt(zmq.LINGER, 1000)
        if encrypt:
            messages.encrypt_client(self.socket, key)
        self.socket.connect(address)
        self.start()

    def put(self, item):
        with self.lock:
            self.unhandled += 1
        self.queue.put(item)

    def reply(self, frames):
        """Send a cell's reply after the output and metrics before it: at once, or behind what is queued."""
        with self.lock:
            if self.unhandled == 0 and not self.closed:
                self._send_packed(frames)
                return
        self.put(Packed(frames))

    def close(self):
        self.put(Wake.CLOSE)
        self.join(timeout=2)

    def run(self):
        trace_due = None  # while a traced cell runs: when its spans are next sent
        while True:
            deadline = min((d for d in (self.due, self.metrics_due, trace_due) if d is not None), default=None)
            try:
                item = self.queue.get(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                item = Wake.TICK
            with self.lock:
                if item is not Wake.TICK:
                    self.unhandled -= 1
                trace_due = self._handle(item, trace_due)
                if self.closed:
                    return

    def _handle(self, item, trace_due):
        """Handle one queued *item* (under ``lock``); return when the running trace's spans are next due."""
        now = time.monotonic()
        match item:
            case Output():
                self.pending.append(item)
                self.due = self.due or now + self.flush_interval
            case Wake.METRICS:
                self.metrics_due = self.metrics_due or now + self.report_interval
            case Packed(frames):
                self._send_packed(frames)
            case TraceStart(cell_id):
                self.tracing, trace_due = cell_id, now + self.report_interval
            case Ask(cell_id, prompt):  # after the output before it
                self._send_output()
                self._send(Input(self.rank, cell_id, prompt))
            case TraceEnd(cell_id, spans, dropped):
                self._send_output()
                trace_due = None
                self._send_trace(cell_id, spans, dropped)
                self.tracing = None
            case Wake.CLOSE:
                self._send_output()
                self._send_metrics()
                self.socket.close()
                self.closed = True
                return trace_due
        if self.due is not None and now >= self.due:
            self._send_output()
        if self.metrics_due is not None and now >= self.metrics_due:
            self._send_metrics()
        if trace_due is not None and now >= trace_due and self.tracing is not None:
            self._send_trace(self.tracing, *tracing.state.drain())
            trace_due = now + self.report_interval
        return trace_due

    def _send_packed(self, frames):
        self._send_output()
        self._send_metrics()
        self.socket.send_multipart(frames, copy=len(frames) == 1)  # no buffers: small, copied

    def _send_trace(self, cell_id, spans, dropped):
        """A batch of spans, with this rank's two clocks read together (to place them in wall-clock time)."""
        if spans or dropped:
            self._send(TraceSpans(self.rank, cell_id, spans, dropped, (tracing.now_ns(), time.time_ns())))

    def _send_metrics(self):
        self.metrics_due = None
        records = self.metrics.drain()
        if records:
            self._send(Metrics(self.rank, records))

    def _send_output(self):
        items, self.pending, self.due = self.pending, [], None
        merged = {}
        for item in items:
            merged.setdefault((item.cell_id, item.stream), []).append(item.text)
        for (cell_id, name), texts in merged.items():
            self._send(Out(self.rank, cell_id, name, "".join(texts)))

    def _send(self, message):
        self.socket.send_multipart(self.signer.pack(message))
