"""A real Jupyter server on loopback, and a kernel driven through its websocket, as a browser drives it.

Everything a frontend would receive arrives here through the server, after the server's IOPub rate limiting:
what a test sees is what JupyterLab would be sent.
"""

import asyncio
import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid

from jupyter_server.services.kernels.connection.base import deserialize_binary_message
from nbformat.v4 import output_from_msg
from tornado.websocket import websocket_connect
from waiting import wait_for

RATE_LIMIT_WARNINGS = ("IOPub message rate exceeded", "IOPub data rate exceeded")


class JupyterServer:
    """``jupyter server`` on 127.0.0.1 with the default IOPub rate limits spelled out; a context manager."""

    def __init__(self, root, *, msg_rate_limit=1000, data_rate_limit=1_000_000, window=3):
        self.root, self.token = str(root), secrets.token_hex(16)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.args = [
            sys.executable, "-m", "jupyter_server", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0", "--ServerApp.open_browser=False", f"--ServerApp.root_dir={self.root}",
            "--ServerApp.allow_root=True",
            f"--IdentityProvider.token={self.token}",
            f"--ZMQChannelsWebsocketConnection.iopub_msg_rate_limit={msg_rate_limit}",
            f"--ZMQChannelsWebsocketConnection.iopub_data_rate_limit={data_rate_limit}",
            f"--ZMQChannelsWebsocketConnection.rate_limit_window={window}",
        ]
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = None

    def __enter__(self):
        env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
        self.log = open(os.path.join(self.root, "jupyter-server.log"), "w")
        self.process = subprocess.Popen(self.args, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        answered = wait_for(lambda: self._status() is not None or self.process.poll() is not None,
                            "jupyter server to answer or exit", 60, 0.2, required=False)
        if not answered or self.process.poll() is not None:
            self.__exit__()
            raise RuntimeError(f"jupyter server did not start; see {self.log.name}")
        return self

    def __exit__(self, *exc):
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()  # the server shuts its kernels down, and they their worlds
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.log.close()

    def _status(self):
        try:
            return self.request("GET", "/api/status")
        except (ConnectionError, OSError, urllib.error.URLError):
            return None

    def request(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            payload = response.read()
        return json.loads(payload) if payload else None

    async def websocket_kernel(self, name="python3"):
        """A new kernel of this server's (its REST API starts it) and a :class:`WebsocketKernel` talking to it over
        the server's websocket, as JupyterLab does. A kernel driven directly, with no server, is
        ``kernel_session.jupyter_client_kernel``."""
        kernel_id = self.request("POST", "/api/kernels", {"name": name})["id"]
        session = uuid.uuid4().hex
        url = (f"ws://127.0.0.1:{self.port}/api/kernels/{kernel_id}/channels?session_id={session}"
               f"&token={self.token}")
        return WebsocketKernel(await websocket_connect(url, max_message_size=1 << 30), session)


class WebsocketKernel:
    """Execute cells and keep every IOPub message the server forwards, with the time it arrived."""

    def __init__(self, connection, session):
        self.connection, self.session = connection, session

    async def execute(self, code, *, timeout=300):
        """Run *code*; return ``[(arrival time, message), ...]`` of its IOPub messages, until the kernel idles."""
        msg_id = uuid.uuid4().hex
        await self.connection.write_message(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "test", "session": self.session,
                       "date": "", "version": "5.3"},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                        "allow_stdin": False, "stop_on_error": True},
        }))
        received = []

        async def until_idle():
            while True:
                raw = await self.connection.read_message()
                if raw is None:
                    raise ConnectionError("the server closed the kernel's websocket")
                message = deserialize_binary_message(raw) if isinstance(raw, bytes) else json.loads(raw)
                message["wire_bytes"] = len(raw)
                if message.get("channel") != "iopub":
                    continue
                received.append((time.monotonic(), message))
                if (message["msg_type"] == "status" and message["content"]["execution_state"] == "idle"
                        and message["parent_header"].get("msg_id") == msg_id):
                    return received

        return await asyncio.wait_for(until_idle(), timeout)  # the whole read, one timeout

    async def close(self):
        self.connection.close()


def outputs_of(messages):
    """The outputs a notebook would save from a cell's *messages* (``(time, message)`` pairs), in order."""
    kinds = ("stream", "execute_result", "display_data", "error")
    return [output_from_msg(message) for _, message in messages if message["msg_type"] in kinds]


def busiest(messages, *, seconds, size=lambda message: 1):
    """The largest total of *size* over messages arriving within any *seconds*-long window."""
    times = [(when, size(message)) for when, message in messages]
    best = total = start = 0
    for when, amount in times:
        total += amount
        while times[start][0] < when - seconds:
            total -= times[start][1]
            start += 1
        best = max(best, total)
    return best
