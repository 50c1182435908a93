"""The MPI panel's requests to the Jupyter server: ``GET /mpinb/panel`` gives the state file of each of this
server's kernels that has a world (and whether the kernel is busy, as the server hears it on IOPub); ``POST
/mpinb/panel/<kernel>/stop`` interrupts the kernel as the notebook's Stop button does; ``POST
/mpinb/panel/<kernel>/stacks`` leaves a rank's stacks request for the kernel's panel thread, whose answer comes
back in the state file. The state is read from disk on each request, so a reload or a second tab sees it at once,
and the kernel's shell is never waited on."""

import json
import time
import uuid

import psutil
import tornado
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from ..wire import panel_files

STALE = 10.0  # seconds after which a state file whose kernel process is gone is not shown


def kernel_states(kernel_manager, directory):
    """``[state]`` of each kernel of *kernel_manager* that wrote one, with its ``execution_state`` added."""
    states = []
    for kernel_id in kernel_manager.list_kernel_ids():
        state = panel_files.read_json(panel_files.state_path(kernel_id, directory))
        if not isinstance(state, dict) or state.get("version") != panel_files.VERSION:
            continue
        if time.time() - state.get("time", 0) > STALE and not psutil.pid_exists(state.get("pid", 0) or 0):
            continue
        try:
            state["execution_state"] = kernel_manager.get_kernel(kernel_id).execution_state
        except KeyError:
            continue
        states.append(state)
    return states


class PanelHandler(APIHandler):
    @tornado.web.authenticated
    def get(self):
        directory = panel_files.panel_dir()
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps({"now": time.time(), "kernels": kernel_states(self.kernel_manager, directory)}))


class ActionHandler(APIHandler):
    @tornado.web.authenticated
    async def post(self, kernel_id, action):
        manager = self.kernel_manager
        if kernel_id not in manager.list_kernel_ids():
            return self._refuse(404, f"kernel {kernel_id} is not running in this server")
        body = self.get_json_body() or {}
        # a %%mpi cell running, as the kernel's state file says; else the status the server last heard (which reads
        # idle after a message of another channel, the debugger's or a widget's, while the cell still runs)
        state = panel_files.read_json(panel_files.state_path(kernel_id, panel_files.panel_dir())) or {}
        busy = state.get("cell") is not None or manager.get_kernel(kernel_id).execution_state == "busy"
        if action == "stop":
            if not busy:
                return self._refuse(409, "no cell is running: there is nothing to stop")
            await manager.interrupt_kernel(kernel_id)
            return self.finish(json.dumps({"ok": True, "text": "Stop sent to the kernel (as its Stop button)"}))
        if action == "stacks":
            rank = body.get("rank")
            if not isinstance(rank, int) or isinstance(rank, bool):
                return self._refuse(400, "stacks takes a rank number")
            request_id = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"
            panel_files.post_request(kernel_id, request_id, {"action": "stacks", "rank": rank},
                                     panel_files.panel_dir())
            return self.finish(json.dumps({"ok": True, "request": request_id}))
        return self._refuse(404, f"the panel has no action {action!r}")

    def _refuse(self, status, text):
        self.set_status(status)
        self.finish(json.dumps({"ok": False, "text": text}))


def setup_handlers(web_app):
    base = web_app.settings["base_url"]
    web_app.add_handlers(".*$", [
        (url_path_join(base, "mpinb", "panel"), PanelHandler),
        (url_path_join(base, "mpinb", "panel", r"([\w-]+)", r"(stop|stacks|\w+)"), ActionHandler),
    ])
