"""The wheel ships JupyterLab's MPI panel prebuilt: installed from it (no Node), `jupyter labextension list` shows
the panel enabled, `jupyter labextension disable mpinb-panel` turns it off, and the server extension that feeds it
is enabled by the config file the wheel installs."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

ROOT = Path(__file__).parent.parent
JUPYTER = [sys.executable, "-m", "jupyter"]


def jupyter(*args, env):
    done = subprocess.run([*JUPYTER, *args], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


def test_the_wheel_holds_the_prebuilt_panel_and_enables_it(tmp_path):
    assert (ROOT / "mpinb" / "labextension" / "package.json").exists(), "make labextension builds the panel first"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(tmp_path / "dist"), str(ROOT)], check=True, timeout=240)
    wheel = next((tmp_path / "dist").glob("mpinb-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    data = next(name.split("/data/")[0] for name in names if "/data/" in name) + "/data/"
    assert data + "share/jupyter/labextensions/mpinb-panel/package.json" in names
    assert any(name.startswith(data + "share/jupyter/labextensions/mpinb-panel/static/remoteEntry.") for name in names)
    assert data + "etc/jupyter/jupyter_server_config.d/mpinb.json" in names

    # the wheel's data files where an install puts them, under a prefix of the test's own (pip install --prefix
    # would first uninstall the mpinb of the environment the tests run in)
    prefix = tmp_path / "prefix"
    with zipfile.ZipFile(wheel) as archive:
        for name in names:
            if name.startswith(data) and not name.endswith("/"):
                target = prefix / name[len(data):]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(archive.read(name))
    env = dict(os.environ, JUPYTER_PATH=str(prefix / "share" / "jupyter"),
               JUPYTER_CONFIG_PATH=str(prefix / "etc" / "jupyter"), JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
               JUPYTER_PREFER_ENV_PATH="0")
    listed = jupyter("labextension", "list", env=env)
    line = next((line for line in listed.splitlines() if "mpinb-panel" in line), "")
    assert str(prefix) in listed and "enabled" in line and "OK" in line, listed
    assert "mpinb.server" in jupyter("server", "extension", "list", env=env)

    jupyter("labextension", "disable", "--level=user", "mpinb-panel", env=env)
    line = next(line for line in jupyter("labextension", "list", env=env).splitlines() if "mpinb-panel" in line)
    assert "disabled" in line, line
