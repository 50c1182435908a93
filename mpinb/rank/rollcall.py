"""Where is this rank, MPI-wise? A thread that says so when a collective has waited too long, and on request.

The thread owns a socket of its own to the notebook's cell channel (the rank's main thread may be blocked in
MPI, where mpi4py releases the GIL, so this thread runs). When the main thread has waited in one collective
longer than ``after`` seconds, it sends a :class:`~mpinb.wire.kinds.Waiting` once; asked by a
:class:`~mpinb.wire.kinds.RollCall`, it answers a :class:`~mpinb.wire.kinds.Where` at once, ``where`` being
:meth:`mpinb.rank.tracing.State.where` plus the file the running cell was compiled as. Asked for the main
thread's Python stack (:class:`~mpinb.wire.kinds.AskStack`, for a rank on another host, whose stack file the
notebook cannot read), it answers a :class:`~mpinb.wire.kinds.Stack` (``stacks.main_thread_stack``); for its
native stack (:class:`~mpinb.wire.kinds.AskNative`), a :class:`~mpinb.wire.kinds.Native` read by py-spy on this
host (``native_stack.own``), from a thread of its own.
"""

import dataclasses
import os
import queue
import sys
import threading
import time

import zmq

from ..wire import kinds, messages
from ..wire.kinds import (AskNative, AskStack, DebugCommand, Listening, Native, Settle, Settled, Stack, Stdin, Waiting,
                          Where)
from . import stacks, tracing


class RollCall(threading.Thread):
    def __init__(self, context, address, key, rank, *, every=0.05, encrypt=False):
        super().__init__(name="mpinb-rollcall", daemon=True)
        self.rank, self.every = rank, every
        self.signer, self.verifier = messages.Signer(key, f"rank/{rank}/rollcall"), messages.Verifier(key)
        self.after = 1.0  # each cell sends the notebook's setting
        self.cell = None  # the running cell's id, None between cells
        self.socket = context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.IDENTITY, f"rollcall-{rank}".encode())
        self.socket.setsockopt(zmq.LINGER, 0)
        if encrypt:
            messages.encrypt_client(self.socket, key)
        self.socket.connect(address)
        self.reported = None  # the wait last reported, so each is reported once
        self.outcomes = queue.SimpleQueue()  # what settling threads report, sent by this thread (it owns the socket)
        self.closing = False
        self.start()

    def run(self):
        self._send(Listening(self.rank))
        poller = zmq.Poller()
        poller.register(self.socket, zmq.POLLIN)
        while not self.closing:
            try:
                events = poller.poll(int(self.every * 1000))
            except zmq.ZMQError:
                return
            while not self.outcomes.empty():
                self._send(self.outcomes.get())
            if events:
                match self.verifier.unpack(self.socket.recv_multipart()):
                    case kinds.RollCall(number):
                        self._send(Where(self.rank, self.cell, dataclasses.replace(self.where(), asked=number,
                                                                                   usage=own_usage())))
                    case Stdin(line):
                        from .debug import post_mortem as debug

                        debug.answer(line)
                    case DebugCommand() as command:
                        from .debug import visual_debugger

                        visual_debugger.request(command)
                    case AskStack(number):
                        self._send(Stack(self.rank, number, stacks.main_thread_stack()))
                    case AskNative(number):  # py-spy takes a while: the roll call goes on meanwhile
                        threading.Thread(target=self._native, args=(number,), name="mpinb-native-stack",
                                         daemon=True).start()
                    case Settle(number, items):
                        # in a thread of its own: a step that blocks must not silence the roll call
                        threading.Thread(target=self._settle, args=(number, items), name="mpinb-settle",
                                         daemon=True).start()
                continue
            current = tracing.state.waiting_in()
            if current is None or self.after is None or current is self.reported:
                continue
            if (tracing.now_ns() - current[3]) / 1e9 >= self.after and self.cell is not None:
                self.reported = current
                self._send(Waiting(self.rank, self.cell, self.where()))
        self.socket.close()

    def _native(self, number):
        from .debug.native_stack import own

        self.outcomes.put(Native(self.rank, number, *own()))

    def _settle(self, number, items):
        from .settle import settle

        self.outcomes.put(Settled(self.rank, number, settle(items)))

    def where(self):
        return dataclasses.replace(tracing.state.where(), cell_file=stacks.current_cell_file)

    def _send(self, message):
        try:
            self.socket.send_multipart(self.signer.pack(message))
        except zmq.ZMQError:
            pass

    def close(self):
        self.closing = True
        self.join(timeout=1)


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def own_usage():
    """(this process's monotonic clock, its CPU seconds, its resident bytes or ``None``, its pid, its GPU's use or
    ``None``): what the MPI panel shows of a rank on another host, whose process the notebook cannot read, and of
    every rank's GPU (:func:`gpu_usage`)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            resident = int(statm.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):  # not Linux
        resident = None
    return time.monotonic(), time.process_time(), resident, os.getpid(), gpu_usage()


def gpu_usage():
    """(bytes torch's CUDA allocator holds on this rank's device, the device's use in percent or ``None``), once
    the rank's code has used CUDA through torch; else ``None``. Asked from this thread, so it never starts CUDA
    itself: a rank that has not touched its GPU has nothing to show."""
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_initialized():
            return None
        device = torch.cuda.current_device()
        memory = torch.cuda.memory_reserved(device)
    except Exception:  # noqa: BLE001 - a torch without CUDA, or a device gone
        return None
    try:
        use = torch.cuda.utilization(device)  # the whole device's, through NVML (pynvml)
    except Exception:  # noqa: BLE001 - no NVML: the memory alone
        use = None
    return memory, use
