"""The rank's way back to the notebook: one thread and one socket that send a cell's output (coalesced),
``mpinb.report()`` records, trace spans, debugger prompts and the visual debugger's messages in the order they
were made, then its reply."""

import codecs
import enum
import io
import queue
import re
import threading
import time
from dataclasses import dataclass

import zmq

from ..wire import bulk as wire_bulk
from ..wire import messages
from ..wire.kinds import Bulk, Input, Metrics, Out, TraceSpans
from . import report, stacks, tracing


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


@dataclass(frozen=True, slots=True)
class Send:
    """A message of the channel's (the visual debugger's), sent after the output written before it."""

    message: object


_SURROGATES = re.compile("[\ud800-\udfff]")
# called before each write of the rank's Python output: what it wrote below Python before goes first
# (``native_output.NativeOutput.drain``, set by the agent)
before_write = None


def readable(text):
    """*text* with each lone surrogate as U+FFFD: that is how Python keeps a byte that was not UTF-8 (a file
    name through ``os.fsdecode``), and no encoding lets it travel or be shown."""
    text = str(text)
    return text if text.isascii() else _SURROGATES.sub("\ufffd", text)


class BytesStream(io.RawIOBase):
    """``sys.stdout.buffer``: bytes decoded as UTF-8, what is not UTF-8 shown as U+FFFD, written to *text*."""

    def __init__(self, text):
        self.text, self.decoder = text, codecs.getincrementaldecoder("utf-8")(errors="replace")

    def writable(self):
        return True

    def write(self, data):
        data = memoryview(data).cast("B")
        self.text.write(self.decoder.decode(data))
        return data.nbytes


class ChannelStream(io.TextIOBase):
    """``sys.stdout``/``sys.stderr`` while a cell runs: text goes to the outbox, tagged with the cell; bytes
    written to its ``buffer`` too, as text."""

    def __init__(self, outbox, cell_id, name, original):
        self.outbox, self.cell_id, self.name, self.original = outbox, cell_id, name, original
        self._buffer = None

    @property
    def buffer(self):
        if self._buffer is None:
            self._buffer = BytesStream(self)
        return self._buffer

    @property
    def encoding(self):
        return "utf-8"

    def writable(self):
        return True

    def write(self, text):
        if text:
            if before_write is not None:
                before_write()
            shown = readable(text)
            self.outbox.put(Output(self.cell_id, self.name, shown))
            if self.name == "stderr":
                stacks.note_stderr(shown)
        return len(text)

    def fileno(self):
        return self.original.fileno()


class BetweenCells(ChannelStream):
    """``sys.stdout``/``sys.stderr`` between cells: what the rank's threads write goes to the notebook, which shows
    it with the next cell (the engine's own stream has no reader then). The main thread's writes are those of
    ipyparallel's requests (``%%px``, ``apply``): they stay the engine's, for ipyparallel to show."""

    def __init__(self, outbox, name, original):
        super().__init__(outbox, None, name, original)

    def write(self, text):
        if threading.current_thread() is threading.main_thread():
            return self.original.write(text)
        return super().write(text)

    def flush(self):
        self.original.flush()

    def __getattr__(self, name):  # the engine's stream's own (ipykernel's set_parent, which routes its output)
        if name == "original":
            raise AttributeError(name)
        return getattr(self.original, name)


class Outbox(threading.Thread):
    """Owns the socket back to the notebook; sends output chunks in batches and replies at once, in order.

    A reply is sent by the thread that made it, when everything put before it has been handled (a trivial cell
    then wakes no second thread); otherwise it queues behind what is still waiting. The socket is used under
    ``lock`` only, by one thread at a time.
    """

    def __init__(self, context, address, key, rank, flush_interval, encrypt=False, bulk=None):
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
        self.bulk = self.sealer = None
        if bulk is not None:  # large messages sealed with AES-GCM, on a socket of their own (wire/bulk.py)
            self.bulk = context.socket(zmq.PUSH)
            self.bulk.setsockopt(zmq.LINGER, 1000)
            self.bulk.connect(bulk)
            self.sealer = wire_bulk.Sealer(key, f"rank/{rank}")
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
            case Send(message):
                self._send_output()
                self._send(message)
            case TraceEnd(cell_id, spans, dropped):
                self._send_output()
                trace_due = None
                self._send_trace(cell_id, spans, dropped)
                self.tracing = None
            case Wake.CLOSE:
                self._send_output()
                self._send_metrics()
                self.socket.close()
                if self.bulk is not None:
                    self.bulk.close()
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
        if self.sealer is not None and len(frames) > 1 and \
                sum(memoryview(frame).nbytes for frame in frames) >= wire_bulk.MINIMUM:
            self._send(Bulk(self.rank))  # in order with the output: the notebook takes the message there
            for chunk in self.sealer.seal(frames):
                self.bulk.send_multipart(chunk, copy=False)
            return
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
