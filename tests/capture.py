"""What crosses a host's link, as an eavesdropper sees it: a packet capture (scapy) on an interface of the
host's network namespace, started and stopped from the notebook's side (tests/multihost_driver.py steps), and a
replay of a captured TCP stream into a fresh connection, as an attacker on the network would send it."""

import socket
import threading
import time

from scapy.all import IP, TCP, Ether, rdpcap, wrpcap
from waiting import wait_for

_capture = None


class _Capture(threading.Thread):
    """Every frame on an interface, read from a packet socket that is open once the constructor returns."""

    def __init__(self, iface):
        super().__init__(daemon=True)
        self.socket = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))  # ETH_P_ALL
        self.socket.bind((iface, 0))
        self.socket.settimeout(0.1)
        self.frames, self.stopping = [], False
        self.start()

    def run(self):
        while not self.stopping:
            try:
                self.frames.append(self.socket.recv(1 << 16))
            except TimeoutError:
                pass
        self.socket.setblocking(False)  # what arrived before the stop is kept, read or not
        while True:
            try:
                self.frames.append(self.socket.recv(1 << 16))
            except (BlockingIOError, InterruptedError):
                break
        self.socket.close()


def start(iface="eth0"):
    """Capture every frame on *iface* (of this process's network namespace) from now on."""
    global _capture
    _capture = _Capture(iface)
    return iface


def stop(path, until=None, timeout=30):
    """End the capture, once a frame holding the bytes *until* went by (for up to *timeout* s: a packet sent just
    before may wait for its address to be resolved); write it to *path* (pcap) and return the number of frames."""
    global _capture
    if until is not None:
        wait_for(lambda: any(until in f for f in list(_capture.frames)), f"a frame holding {until!r}", timeout,
                 required=False)
    _capture.stopping = True
    _capture.join()
    frames, _capture = _capture.frames, None
    wrpcap(str(path), [Ether(frame) for frame in frames])
    return len(frames)


def payload(path):
    """Every TCP and UDP payload byte of the capture at *path*, concatenated (what a reader of the wire sees)."""
    return b"".join(bytes(packet[IP].payload.payload) for packet in rdpcap(str(path)) if IP in packet)


def streams_to(path, port):
    """``{(source, source port): bytes}``: the data sent to *port* on each TCP connection the capture saw open,
    in sequence order."""
    segments, starts = {}, {}
    for packet in rdpcap(str(path)):
        if IP not in packet or TCP not in packet or packet[TCP].dport != port:
            continue
        key = (packet[IP].src, packet[TCP].sport)
        if packet[TCP].flags.S:
            starts[key] = packet[TCP].seq + 1
        if bytes(packet[TCP].payload):
            segments.setdefault(key, {})[packet[TCP].seq] = bytes(packet[TCP].payload)  # seen twice: once
    streams = {}
    for key, parts in segments.items():
        data, end = [], starts.get(key)
        if end is None:
            continue  # begun before the capture
        for seq, part in sorted(parts.items()):
            if end is not None and seq != end:
                raise AssertionError(f"the capture missed bytes of the stream from {key}: {end} to {seq}")
            data.append(part)
            end = seq + len(part)
        streams[key] = b"".join(data)
    return streams


def replay(path, host, port):
    """Send the longest captured stream to *port* again, byte for byte, on a new connection to *host*, taking
    turns in ZMTP's greeting as a peer does (its first 10 bytes, then the rest of the 64, then everything else);
    the number of bytes sent. The connection stays open a moment, then closes."""
    data = max(streams_to(path, port).values(), key=len)
    with socket.create_connection((host, port), timeout=10) as connection:
        for start, end in ((0, 10), (10, 64), (64, len(data))):
            connection.sendall(data[start:end])
            if end < len(data):
                connection.recv(1 << 16)  # the other side's part of the greeting
        time.sleep(1.0)  # the receiver reads what it will before the connection closes
    return len(data)


_monitor = None


def watch(sock):
    """Watch *sock* (a zmq socket that listens) for :func:`refused`."""
    global _monitor
    _monitor = sock.get_monitor_socket()


def refused(timeout=60):
    """Wait for the watched socket to refuse a connection's handshake; the event's name (``None``: none came in
    *timeout* seconds)."""
    monitor = _monitor
    import zmq
    from zmq.utils.monitor import recv_monitor_message

    failed = (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
              | zmq.EVENT_HANDSHAKE_FAILED_AUTH)

    def refusal():
        if monitor.poll(100):
            event = recv_monitor_message(monitor)
            if event["event"] & failed:
                return zmq.Event(event["event"]).name
        return None

    return wait_for(refusal, "a refused handshake", timeout, interval=0, required=False)


def dropped(channel, timeout=60):
    """Read *channel* until its verifier has dropped a message (a replay arriving); what it dropped, by reason."""

    def rejected():
        channel.receive(0.1)
        return channel.verifier.rejected

    wait_for(rejected, "a dropped message", timeout, interval=0, required=False)
    return dict(channel.verifier.rejected)
