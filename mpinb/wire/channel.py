"""The notebook end of the cell channel: one message per rank out, output and replies back, over ZMQ (loopback
unless the world listens on another address), every message signed with the world's key and numbered, and
encrypted with CurveZMQ when the channel listens off loopback (``messages.py``); there a rank's large messages
come sealed with AES-GCM on a socket of their own (``bulk.py``).

ipyparallel starts the ranks and stays their control plane (registration, heartbeats, signals, status); cells
take this shorter path because an ipyparallel execute or apply request costs every engine about 2 ms of CPU in
the kernel machinery (measured: see benchmarks/RESULTS.md), which on a few cores grows the round trip linearly
with the number of ranks.
"""

import collections
import os
import secrets
import socket
import time

import zmq

from . import bulk, messages
from .shm import Segments
from .failures import MPIError
from .ranks import label_ranks
from .kinds import (AskNative, AskStack, Bulk, Cell, CellOptions, Hello, Input, Kept, Metrics, Native, Out, Reply,
                    RollCall, Settle, Stack, Stdin, TraceSpans)


class Unreached(MPIError):
    """Some ranks are no longer connected to the cell channel (their process ended, or their connection did):
    the cell *cell_id* went to *reached* only (a rank that got it first may have ended the others, MPI_Abort)."""

    def __init__(self, cell_id, reached, unreached):
        super().__init__(f"{label_ranks(unreached)} {'is' if len(unreached) == 1 else 'are'} no longer connected "
                         "to the cell channel (the process ended, or its connection did): %mpi restart starts a "
                         "fresh world of the same size")
        self.cell_id, self.reached, self.unreached = cell_id, reached, unreached


class Channel:
    """Sockets the ranks' agents connect to: a ROUTER that sends cells, a PULL that gathers what comes back."""

    def __init__(self, ip="127.0.0.1", *, secret, encrypt=None):
        """*secret*: ipyparallel's session key, from which the ranks derive the channel's key, so that only a
        salt travels; ``None`` where ipyparallel runs CurveZMQ without a session key, and the key, made here,
        travels to the ranks inside ipyparallel's encrypted messages (``sent_key``)."""
        self.salt = secrets.token_bytes(16)
        self.sent_key = None if secret else secrets.token_bytes(32)
        self.key = self.sent_key or messages.derive_key(secret, self.salt)
        self.signer, self.verifier = messages.Signer(self.key, "notebook"), messages.Verifier(self.key)
        bind, host = _addresses(ip)
        self.encrypt = not bind.startswith("127.") if encrypt is None else encrypt
        context = zmq.Context.instance()
        self.cells = context.socket(zmq.ROUTER)
        self.cells.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.cells.setsockopt(zmq.LINGER, 0)
        self.events = context.socket(zmq.PULL)
        self.events.setsockopt(zmq.LINGER, 0)
        self.bulk = self.bulk_url = self.opener = None
        self.segments = Segments()  # the ranks' shared-memory segments on this host, the large messages' other path
        if self.encrypt:
            messages.encrypt_server(self.cells, self.key)
            messages.encrypt_server(self.events, self.key)
            self.bulk = context.socket(zmq.PULL)  # no CurveZMQ: each chunk comes sealed
            self.bulk.setsockopt(zmq.LINGER, 0)
            self.bulk_url = f"tcp://{host}:{self.bulk.bind_to_random_port(f'tcp://{bind}')}"
            self.opener = bulk.Opener(self.key, self.verifier.rejected)
        # rank -> what came from its outbox after the marker of a large message still being opened: the marker's
        # place (AWAITED) first, then messages held to keep the rank's order, and maybe more markers
        self._awaited = {}
        self._bulk_heard = 0.0  # when the bulk socket last gave a chunk, or a marker was first awaited
        self.cells_url = f"tcp://{host}:{self.cells.bind_to_random_port(f'tcp://{bind}')}"
        self.events_url = f"tcp://{host}:{self.events.bind_to_random_port(f'tcp://{bind}')}"
        self.poller = zmq.Poller()
        self.poller.register(self.cells, zmq.POLLIN)
        self.poller.register(self.events, zmq.POLLIN)
        if self.bulk is not None:
            self.poller.register(self.bulk, zmq.POLLIN)
        self._next_cell = 0
        self._held = []  # messages that arrived while :meth:`stacks` waited, for the next receive
        # messages other threads posted to ranks' roll-call threads, sent by the thread that receives (it owns
        # the sockets); a byte on the pipe wakes it
        self._posted = collections.deque()
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        self.poller.register(self._wake_read, zmq.POLLIN)

    def wait_for_ranks(self, ranks, timeout, *, check=None):
        """Wait until every rank's agent said hello; raise ``TimeoutError`` naming the silent ones. *check* is
        called between waits (it may raise to give up).

        Returns ``{rank: path}`` of the files the ranks dump their stacks to (see ``rank/stacks.py``).
        """
        waiting, stack_files = set(ranks), {}
        deadline = time.monotonic() + timeout
        while waiting:
            if check is not None:
                check()
            if self.verifier.mismatch is not None:
                raise self.verifier.mismatch
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"ranks {sorted(waiting)} did not connect to the cell channel in {timeout:g} s")
            for message in self.receive(min(left, 0.1)):
                if isinstance(message, Hello):
                    waiting.discard(message.rank)
                    stack_files[message.rank] = message.stacks
        return stack_files

    def send_cell(self, ranks, code, number, options=None):
        """Send *code* to *ranks*; return the id that its output and replies carry.

        *options* (:class:`~mpinb.wire.kinds.CellOptions`) travel with it.
        """
        self._next_cell += 1
        cell_id = self._next_cell
        frames = self.signer.pack(Cell(cell_id, code, number, options or CellOptions()))
        unreached = []
        for rank in ranks:
            try:
                self.cells.send_multipart([str(rank).encode(), *frames])
            except zmq.ZMQError as exc:
                if exc.errno != zmq.EHOSTUNREACH:
                    raise
                unreached.append(rank)
        if unreached:
            raise Unreached(cell_id, [rank for rank in ranks if rank not in unreached], unreached)
        return cell_id

    def roll_call(self, ranks, number):
        """Ask *ranks* where they are, MPI-wise (each rank's roll-call thread answers, see
        ``rank/rollcall.py``); *number* comes back with the answers. Ranks not connected are skipped."""
        frames = self.signer.pack(RollCall(number))
        for rank in ranks:
            try:
                self.cells.send_multipart([f"rollcall-{rank}".encode(), *frames], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass

    def settle(self, rank, number, items):
        """Ask *rank*'s roll-call thread to do *items* (see ``rank/settle.py``); it answers
        :class:`~mpinb.wire.kinds.Settled`."""
        try:
            self.cells.send_multipart([f"rollcall-{rank}".encode(), *self.signer.pack(Settle(number, items))],
                                      zmq.NOBLOCK)
        except zmq.ZMQError:
            pass

    def stacks(self, ranks, number, timeout):
        """Ask *ranks*' roll-call threads for their main thread's stack: ``{rank: stack}`` of those that answered
        within *timeout* seconds (``rank/stacks.main_thread_stack``). What else arrives meanwhile is kept for
        the next :meth:`receive`."""
        return self._ask_roll_calls(ranks, AskStack(number), Stack, number, timeout, lambda answer: answer.stack)

    def native(self, ranks, number, timeout):
        """Ask *ranks*' roll-call threads for their main thread's native stack, read by py-spy on their host:
        ``{rank: (frames, note)}`` of those that answered within *timeout* seconds (``rank/debug/native_stack.own``).
        What else arrives meanwhile is kept for the next :meth:`receive`."""
        return self._ask_roll_calls(ranks, AskNative(number), Native, number, timeout,
                                    lambda answer: (answer.frames, answer.note))

    def _ask_roll_calls(self, ranks, request, kind, number, timeout, value):
        """Send *request* to *ranks*' roll-call threads; ``{rank: value(answer)}`` of the *kind* answers to
        *number* that came within *timeout* seconds, what else arrives kept for the next :meth:`receive`."""
        frames = self.signer.pack(request)
        for rank in ranks:
            try:
                self.cells.send_multipart([f"rollcall-{rank}".encode(), *frames], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass
        answers, deadline = {}, time.monotonic() + timeout
        while len(answers) < len(ranks) and time.monotonic() < deadline:
            for message in self.receive(deadline - time.monotonic(), keep=False):
                if isinstance(message, kind) and message.number == number and message.rank in ranks:
                    answers[message.rank] = value(message)
                else:
                    self._held.append(message)
        return answers

    def hold(self, message):
        """Keep *message*, received while waiting for something else, for the next :meth:`receive`."""
        self._held.append(message)

    def send_stdin(self, rank, line):
        """A line typed at *rank*'s debugger prompt (``None``: end of input)."""
        self.cells.send_multipart([f"rollcall-{rank}".encode(), *self.signer.pack(Stdin(line))])

    def post(self, rank, message):
        """Send *message* to *rank*'s roll-call thread from any thread: it leaves with the next :meth:`receive`
        (which this wakes), from the thread that receives."""
        self._posted.append((rank, message))
        if self._wake_write >= 0:  # else closed: the world is gone, and whoever waits for an answer is told
            os.write(self._wake_write, b"x")

    def _send_posted(self):
        try:
            os.read(self._wake_read, 4096)
        except (BlockingIOError, OSError):
            pass
        while self._posted:
            rank, message = self._posted.popleft()
            try:
                self.cells.send_multipart([f"rollcall-{rank}".encode(), *self.signer.pack(message)], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass

    def receive(self, timeout, *, keep=True):
        """Messages that arrive within *timeout* seconds (all that are ready, at least one unless it expires),
        after those kept while waiting for something else (*keep*).

        A reply that came with raw buffers (a gather sent as frames) carries them as ``reply.buffers``.
        """
        if keep and self._held:
            messages, self._held = self._held, []
            timeout = 0
        else:
            messages = []
        for sock, _ in self.poller.poll(max(0, int(timeout * 1000))):
            if sock == self._wake_read:
                self._send_posted()
                continue
            if sock is self.bulk:
                self._read_bulk(messages)
                continue
            # at most BATCH from a socket per call: ranks that send as fast as the notebook reads (a tight
            # report() loop) must not keep the caller from its checks between calls (a Stop, a deadline)
            for _ in range(BATCH):
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                if sock is self.cells:
                    frames = frames[1:]  # drop the ROUTER's peer identity
                unpacked = self.verifier.unpack_with_buffers(frames)
                if unpacked is None:
                    continue
                message = _with_buffers(*unpacked)
                if isinstance(message, Bulk):  # its large message comes on the bulk socket, in its place here
                    self._await(message.rank, messages)
                elif isinstance(message, _IN_ORDER) and message.rank in self._awaited:
                    self._awaited[message.rank].append(message)
                else:
                    messages.append(message)
        if self._awaited and time.monotonic() - self._bulk_heard > BULK_WAIT:
            self._give_up_bulk(messages)
        return messages

    def _await(self, rank, messages):
        """*rank*'s large message goes next in its order: now if it has opened already, else when it does (what
        the rank sends meanwhile is held behind it)."""
        if self.opener is None:  # no bulk socket here (the channel is on loopback): nothing can come
            self.verifier.rejected["malformed"] += 1
            return
        if rank in self._awaited:
            self._awaited[rank].append(AWAITED)
            return
        self._awaited[rank] = collections.deque([AWAITED])
        self._bulk_heard = max(self._bulk_heard, time.monotonic())
        self._deliver(rank, messages)

    def _read_bulk(self, messages):
        """Chunks ready on the bulk socket (at most BATCH): each large message they complete, with what its rank
        sent after it, once its marker came. Never waits: a rank that dies mid-message is for the caller's checks
        to notice."""
        for _ in range(BATCH):
            try:
                frames = self.bulk.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            self._bulk_heard = time.monotonic()
            sender = self.opener.feed(frames)
            if sender is not None:
                rank = int(sender.removeprefix(b"rank/"))
                if rank in self._awaited:
                    self._deliver(rank, messages)

    def _deliver(self, rank, messages):
        """Move *rank*'s awaited messages to *messages* for as long as each large one among them has opened."""
        queue = self._awaited[rank]
        while queue:
            if queue[0] is AWAITED:
                frames = self.opener.take(f"rank/{rank}".encode())
                if frames is None:
                    return
                queue.popleft()
                unpacked = self.verifier.unpack_with_buffers(frames)
                if unpacked is not None:
                    messages.append(_with_buffers(*unpacked))
            else:
                messages.append(queue.popleft())
        del self._awaited[rank]

    def _give_up_bulk(self, messages):
        """``BULK_WAIT`` seconds without a chunk while large messages were awaited: they are lost (their ranks died
        mid-message, or what came did not open); what their ranks sent after them is delivered."""
        for rank, queue in list(self._awaited.items()):
            self.verifier.rejected["lost"] += sum(1 for entry in queue if entry is AWAITED)
            messages.extend(entry for entry in queue if entry is not AWAITED)
            self.opener.forget(f"rank/{rank}".encode())
        self._awaited.clear()

    def close(self):
        self.cells.close()
        self.events.close()
        if self.bulk is not None:
            self.bulk.close()
        self.segments.close()
        ends, self._wake_read, self._wake_write = (self._wake_read, self._wake_write), -1, -1
        for end in ends:
            os.close(end)


BATCH = 64  # messages read from one socket per receive() at most
BULK_WAIT = 10.0  # seconds without a chunk after which an announced large message is given up (its rank died)
AWAITED = object()  # a large message's place among its rank's messages
_IN_ORDER = (Out, Metrics, TraceSpans, Input, Reply, Kept)  # what a rank's outbox sends, in one order


def _with_buffers(message, buffers):
    """*message*, a reply carrying the raw *buffers* it came with (a gather sent as frames) as ``reply.buffers``."""
    if buffers and isinstance(message, Reply):
        message.reply.buffers = buffers
    return message


def _addresses(ip):
    """``(address to bind, address ranks connect to)`` for a controller that listens on *ip*."""
    if ip in ("", "localhost"):
        return "127.0.0.1", "127.0.0.1"
    if ip in ("*", "0.0.0.0"):
        return "*", reachable_address()
    return ip, ip


def reachable_address():
    """An address of this host that other hosts can reach: its name's, unless that is loopback (as Debian's
    ``/etc/hosts`` makes it), else the first non-loopback IPv4 address of an interface."""
    try:
        address = socket.gethostbyname(socket.getfqdn())
    except OSError:
        address = "127.0.0.1"
    if not address.startswith("127."):
        return address
    import psutil

    for addresses in psutil.net_if_addrs().values():
        for entry in addresses:
            if entry.family == socket.AF_INET and not entry.address.startswith("127."):
                return entry.address
    return address
