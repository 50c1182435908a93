"""The notebook's side of benchmarks/hosts.py, run inside one of its hosts (and its TCP peers on the others).

    python benchmarks/hosts_driver.py notebook SETUP_JSON   # an IPython shell with mpinb, driven over stdin
    python benchmarks/hosts_driver.py serve ADDRESS PORT     # a TCP peer that sends bytes on request

``notebook`` reads one JSON request a line from stdin and writes one ``REPLY {json}`` line to stdout for each
(what the shell itself prints is kept out of stdout). Requests: ``{"op": "line", "line": "start -n 4"}`` (``%mpi``),
``{"op": "cell", "args": "--gather x", "code": "pass"}`` (a ``%%mpi`` cell, timed with ``time.perf_counter``
around ``run_cell_magic``), ``{"op": "eval", "expr": ...}``, ``{"op": "check", "name": "x", "floats": n,
"ranks": 4}`` (are the gathered values exactly ``np.arange(n, dtype=float32) + rank``?), ``{"op": "tcp",
"address": a, "port": p, "send": n, "fetch": [a2, p2, m] or null}`` (time to receive n bytes from a ``serve``
peer into a preallocated buffer, that peer first fetching m bytes from the next one when ``fetch`` is given),
``{"op": "zmq", "address": a, "port": p, "send": n, "curve": bool or "sealed", "bind": address}`` (time to
receive n bytes as one ZeroMQ message that the ``serve`` peer pushes to a PULL socket bound here, with CurveZMQ
when ``curve`` is true, or as AES-GCM chunks as the cell channel sends a large reply across hosts when it is
``"sealed"``,
as the cell channel is across hosts) and ``{"op": "quit"}`` (stops the world and exits).

``serve`` answers each request line ``{"send": n, "fetch": ...}`` on a connection by (first receiving ``fetch``'s
bytes from the peer it names, over a connection it keeps) sending n bytes with ``sendall``, or, when the request
names a ``push`` endpoint, as one ZeroMQ message to it.
"""

import contextlib
import io
import json
import socket
import sys
import threading
import time

import numpy as np

BENCH_KEY = bytes(range(32))  # the sealed arm's channel key: a benchmark's, on its own hosts

CHUNK = 1 << 20


class Peer:
    """A kept connection to a ``serve`` peer, and the buffer that what it sends lands in."""

    def __init__(self, address, port):
        self.socket = socket.create_connection((address, port), timeout=120)
        self.file = self.socket.makefile("wb")
        self.buffer = np.empty(0, dtype=np.uint8)

    def ask(self, request):
        self.file.write((json.dumps(request) + "\n").encode())
        self.file.flush()

    def fetch(self, send, fetch=None, fresh=False):
        """Ask for *send* bytes (the peer first fetching *fetch* = ``[address, port, bytes]``) and receive them;
        into new memory with *fresh* (its pages faulted in as they are written, as for values one keeps)."""
        if fresh:
            self.buffer = np.empty(send, dtype=np.uint8)
        elif self.buffer.size < send:
            self.buffer = np.ones(send, dtype=np.uint8)  # touched: no page faults in the timed receive
        self.ask({"send": send, "fetch": fetch})
        view, got = memoryview(self.buffer)[:send], 0
        while got < send:
            n = self.socket.recv_into(view[got:], min(CHUNK * 4, send - got))
            if not n:
                raise ConnectionError("the peer closed the connection")
            got += n
        return self.buffer[:send]


def serve(address, port):
    import zmq

    payload = np.ones(1, dtype=np.uint8)
    upstream, pushes, sealers = {}, {}, {}
    lock = threading.Lock()

    def handle(connection):
        nonlocal payload
        with connection, connection.makefile("rb") as requests:
            for line in requests:
                request = json.loads(line)
                if request.get("fetch"):
                    a, p, m = request["fetch"]
                    with lock:
                        peer = upstream.get((a, p)) or upstream.setdefault((a, p), Peer(a, p))
                    peer.fetch(m)
                n = request["send"]
                if payload.size < n:
                    payload = np.ones(n, dtype=np.uint8)
                if request.get("push"):  # one ZeroMQ message to the asker's PULL socket, CurveZMQ if it says so
                    push = pushes.get(request["push"])
                    if push is None:
                        push = pushes[request["push"]] = zmq.Context.instance().socket(zmq.PUSH)
                        if request.get("serverkey"):
                            push.curve_serverkey = request["serverkey"].encode()
                            push.curve_publickey, push.curve_secretkey = zmq.curve_keypair()
                        push.connect(request["push"])
                    if request.get("sealed"):  # as a rank sends a large reply: AES-GCM chunks (wire/bulk.py)
                        from mpinb.wire.bulk import Sealer

                        sealer = sealers.get(request["sealed"]) or sealers.setdefault(
                            request["sealed"], Sealer(bytes.fromhex(request["sealed"]), "rank/0"))
                        for chunk in sealer.seal([memoryview(payload)[:n]]):
                            push.send_multipart(chunk, copy=False)
                    else:
                        push.send(memoryview(payload)[:n], copy=False)
                else:
                    connection.sendall(memoryview(payload)[:n])

    listener = socket.create_server((address, port), backlog=16)
    print("READY", flush=True)
    while True:
        connection, _ = listener.accept()
        threading.Thread(target=handle, args=(connection,), daemon=True).start()


def notebook(setup):
    from IPython.core.interactiveshell import InteractiveShell

    reply_to = sys.stdout
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "mpinb")
    magics = ip.magics_manager.registry["MPIMagics"]
    for name, value in setup.items():
        setattr(magics, name, value)
    peers, pulls = {}, {}
    from collections import Counter

    from mpinb.wire.bulk import Opener

    opener = Opener(BENCH_KEY, Counter())  # the notebook's side of the sealed arm

    def answer(**reply):
        reply_to.write("REPLY " + json.dumps(reply) + "\n")
        reply_to.flush()

    for line in sys.stdin:
        request = json.loads(line)
        op, out = request["op"], io.StringIO()
        if op == "quit":
            break
        raised, value, seconds = None, None, None
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                if op == "line":
                    ip.run_line_magic("mpi", request["line"])
                elif op == "cell":
                    tic = time.perf_counter()
                    ip.run_cell_magic("mpi", request["args"], request["code"])
                    seconds = time.perf_counter() - tic
                elif op == "eval":
                    value = repr(ip.ev(request["expr"]))
                elif op == "check":
                    gathered = ip.user_ns[request["name"]]
                    base = np.arange(request["floats"], dtype=np.float32)
                    value = sorted(gathered) == list(range(request["ranks"])) and all(
                        gathered[r].dtype == np.float32 and np.array_equal(gathered[r], base + r)
                        for r in range(request["ranks"]))
                elif op == "tcp":
                    key = (request["address"], request["port"])
                    peer = peers.get(key) or peers.setdefault(key, Peer(*key))
                    tic = time.perf_counter()
                    peer.fetch(request["send"], request.get("fetch"), request.get("fresh", False))
                    seconds = time.perf_counter() - tic
                elif op == "zmq":  # n bytes as one ZeroMQ message from a serve peer, encrypted with *curve*
                    import zmq

                    key = (request["address"], request["port"])
                    peer = peers.get(key) or peers.setdefault(key, Peer(*key))
                    curve = request["curve"]
                    if curve not in pulls:
                        pull = zmq.Context.instance().socket(zmq.PULL)
                        public = None
                        if curve is True:
                            public, pull.curve_secretkey = zmq.curve_keypair()
                            pull.curve_server = True
                        port = pull.bind_to_random_port(f"tcp://{request['bind']}")
                        pulls[curve] = pull, f"tcp://{request['bind']}:{port}", public
                    pull, endpoint, public = pulls[curve]
                    sealed = curve == "sealed"
                    tic = time.perf_counter()
                    peer.ask({"send": request["send"], "push": endpoint,
                              "serverkey": public.decode() if public else None,
                              "sealed": BENCH_KEY.hex() if sealed else None})
                    if sealed:
                        while opener.feed(pull.recv_multipart(copy=False)) is None:
                            pass
                        value = len(opener.take(b"rank/0")[0])
                    else:
                        value = len(pull.recv(copy=False))
                    seconds = time.perf_counter() - tic
        except BaseException as exc:  # noqa: BLE001 - reported to the benchmark, which stops on it
            raised = [type(exc).__name__, str(exc)]
        answer(raised=raised, value=value, seconds=seconds, output=out.getvalue()[-2000:])
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        if magics.world is not None and magics.world.running:
            magics.stop()


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2], int(sys.argv[3]))
    else:
        notebook(json.loads(sys.argv[2]))
