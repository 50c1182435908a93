"""A Debug Adapter Protocol client of a real kernel, speaking as JupyterLab's debugger does: requests as
``debug_request`` messages on the control channel, events read from ``debug_event`` messages on iopub."""

import queue
import threading

from waiting import wait_for

# what JupyterLab's debugger sends first (its service's ``start``)
INITIALIZE = {"clientID": "jupyterlab", "clientName": "JupyterLab", "adapterID": "python", "pathFormat": "path",
              "linesStartAt1": True, "columnsStartAt1": True, "supportsVariableType": True,
              "supportsVariablePaging": True, "supportsRunInTerminalRequest": True, "locale": "en-us"}


class DebugClient:
    """Send DAP requests to the kernel of *client* (a started ``jupyter_client`` client) and collect its events.

    The client's iopub channel is read by a thread of this object: cells run with :meth:`execute`, whose output
    it keeps, so that a cell and the debug requests of a stop can overlap as they do in JupyterLab."""

    def __init__(self, client):
        self.client, self.seq = client, 0
        self.events = queue.SimpleQueue()
        self.outputs = {}  # msg_id of an execute request -> its output messages
        self.idle = {}  # msg_id -> threading.Event set when the kernel went idle after it
        self.closing = False
        self.reader = threading.Thread(target=self._read_iopub, daemon=True)
        self.reader.start()

    def _read_iopub(self):
        while not self.closing:
            try:
                message = self.client.get_iopub_msg(timeout=0.2)
            except queue.Empty:
                continue
            kind, parent = message["msg_type"], message["parent_header"].get("msg_id")
            if kind == "debug_event":
                self.events.put(message["content"])
            elif kind == "status" and message["content"]["execution_state"] == "idle" and parent in self.idle:
                self.idle[parent].set()
            elif parent in self.outputs:
                self.outputs[parent].append(message)

    def request(self, command, timeout=60, **arguments):
        """Send one request; its response (a dict with ``success``, ``body``)."""
        self.seq += 1
        content = {"type": "request", "seq": self.seq, "command": command, "arguments": arguments}
        message = self.client.session.msg("debug_request", content)
        self.client.control_channel.send(message)

        def reply():
            try:
                answer = self.client.control_channel.get_msg(timeout=0.1)
            except queue.Empty:
                return None
            return answer["content"] if answer["parent_header"].get("msg_id") == message["header"]["msg_id"] else None

        return wait_for(reply, f"the answer to the debug request {command!r}", timeout, interval=0)

    def start(self):
        """Switch the debugger on as JupyterLab does: initialize, attach, debugInfo."""
        assert self.request("initialize", **INITIALIZE)["success"]
        assert self.request("attach")["success"]
        return self.request("debugInfo")["body"]

    def breakpoints(self, code, lines):
        """Dump a cell and set breakpoints on its *lines* (1-based, as the editor counts them); the cell's path
        and the response."""
        path = self.request("dumpCell", code=code)["body"]["sourcePath"]
        reply = self.request("setBreakpoints", source={"path": path},
                             breakpoints=[{"line": line} for line in lines], sourceModified=False)
        self.request("configurationDone")
        return path, reply

    def execute(self, code, answers=None):
        """Send *code* for execution; its msg_id (read its output with :meth:`output`, wait with :meth:`wait`).
        With *answers* (a list), the cell may prompt (``input()``, pdb): each prompt gets the next answer, then
        ``c``; the prompts are kept in ``self.prompts``."""
        message = self.client.session.msg("execute_request", {
            "code": code, "silent": False, "store_history": True, "user_expressions": {},
            "allow_stdin": answers is not None, "stop_on_error": False})
        msg_id = message["header"]["msg_id"]
        self.outputs[msg_id], self.idle[msg_id] = [], threading.Event()
        if answers is not None:
            self.prompts = []
            threading.Thread(target=self._answer, args=(msg_id, list(answers)), daemon=True).start()
        self.client.shell_channel.send(message)
        return msg_id

    def _answer(self, msg_id, answers):
        while not self.idle[msg_id].is_set() and not self.closing:
            try:
                message = self.client.get_stdin_msg(timeout=0.2)
            except queue.Empty:
                continue
            self.prompts.append(message["content"]["prompt"])
            self.client.input(answers.pop(0) if answers else "c")

    def wait(self, msg_id, timeout=120):
        """Whether the cell ended (the kernel went idle after it) within *timeout* seconds."""
        return self.idle[msg_id].wait(timeout)

    def output(self, msg_id):
        parts = []
        for message in self.outputs[msg_id]:
            kind, content = message["msg_type"], message["content"]
            if kind == "stream":
                parts.append(content["text"])
            elif kind == "error":
                parts.append("\n".join(content["traceback"]))
            elif kind == "execute_result":
                parts.append(content["data"].get("text/plain", ""))
        return "".join(parts)

    def event(self, name, timeout=60):
        """The next event called *name* (others before it are dropped), or ``None`` after *timeout* seconds."""

        def named():
            try:
                event = self.events.get(timeout=0.1)
            except queue.Empty:
                return None
            return event if event.get("event") == name else None

        return wait_for(named, f"a {name!r} event", timeout, interval=0, required=False)

    def close(self):
        self.closing = True
        self.reader.join(timeout=2)


class Panel:
    """What JupyterLab's debugger panel shows of a stop, kept as its debugger service keeps it (JupyterLab 4's
    ``@jupyterlab/debugger`` service and call-stack model), so that a test sees what its user sees.

    A ``continued`` event clears the call stack and the variables. A ``stopped`` one fetches the stopped thread's
    frames; the frame shown stays the one shown before when the new frames hold one with the same source path and
    id, and only otherwise becomes the first of them: its scopes and their variables are fetched only then. A
    debugger that hands out the same ids at every stop thus leaves the panel on the last stop's frame, line and
    variables while its call stack lists the new ones."""

    def __init__(self, dap):
        self.dap = dap
        self.frames, self.frame, self.scopes = [], None, {}

    def stop(self, timeout=60):
        """Take the events up to the next ``stopped`` one as the panel does; that event's body (``None`` when
        nothing stopped within *timeout* seconds)."""

        def stopped():
            try:
                event = self.dap.events.get(timeout=0.1)
            except queue.Empty:
                return None
            if event.get("event") == "continued":
                self.frames, self.frame, self.scopes = [], None, {}
            elif event.get("event") == "stopped":
                self._frames(event["body"]["threadId"])
                return event["body"]
            return None

        return wait_for(stopped, "a 'stopped' event", timeout, interval=0, required=False)

    def _frames(self, thread):
        frames = self.dap.request("stackTrace", threadId=thread)["body"]["stackFrames"]
        key = _frame_key(self.frame) if self.frame is not None else ""
        self.frames = frames
        if not any(_frame_key(frame) == key for frame in frames):
            self.frame = frames[0] if frames else None
            self.scopes = {}
            if self.frame is not None:
                for scope in self.dap.request("scopes", frameId=self.frame["id"])["body"]["scopes"]:
                    self.scopes[scope["name"]] = self.dap.request(
                        "variables", variablesReference=scope["variablesReference"])["body"]["variables"]


def _frame_key(frame):
    return f"{(frame.get('source') or {}).get('path')}-{frame.get('id')}"
