"""JupyterLab's MPI panel, the Jupyter server's end: ``handlers.py`` hands the browser each kernel's world as the
kernel last wrote it (``wire/panel_files.py``), and takes the panel's actions. Enabled by the config file the wheel
installs (``etc/jupyter/jupyter_server_config.d/mpinb.json``); ``jupyter server extension disable mpinb.server``
turns it off."""

from .handlers import setup_handlers

__all__ = ["setup_handlers"]


def _jupyter_server_extension_points():
    return [{"module": "mpinb.server"}]


def _jupyter_labextension_paths():
    return [{"src": "../labextension", "dest": "mpinb-panel"}]


def _load_jupyter_server_extension(serverapp):
    setup_handlers(serverapp.web_app)
    serverapp.log.info("mpinb: the MPI panel's state at /mpinb/panel")
