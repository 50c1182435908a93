"""The line a kernel that may not trace its ranks gets instead of their native frames: said exactly when py-spy
really cannot read them (a kernel run as another user, without CAP_SYS_PTRACE), and not when it can."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                                reason="starts a process as another user (setpriv, as root)")

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"]
CHECK = textwrap.dedent("""
    import sys
    from mpinb.notebook.diagnosis.native import py_spy
    print(py_spy.refusal(int(sys.argv[1])))
""")


def as_nobody(*argv):
    return subprocess.run([*NOBODY, *argv], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HOME": "/tmp"}, cwd="/")


def py_spy_binary():
    found = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(found):
        pytest.skip("py-spy is in the dev extra, which make test installs")
    return found


def test_a_kernel_of_another_user_is_told_why_and_py_spy_indeed_cannot_read_the_rank():
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # a process of root's
    try:
        said = as_nobody(sys.executable, "-c", CHECK, str(rank.pid))
        assert said.returncode == 0, said.stderr
        assert said.stdout.strip() == ("no native frames: the ranks run as user 0 and the kernel as 65534 without "
                                       "CAP_SYS_PTRACE: run the kernel as their user, or with CAP_SYS_PTRACE")
        tried = as_nobody(py_spy_binary(), "dump", "--native", "--pid", str(rank.pid))
        assert tried.returncode != 0, tried.stdout  # what the line spares the user: py-spy's own refusal
        # and as the ranks' own user, nothing is said, and py-spy reads them
        assert subprocess.run([sys.executable, "-c", CHECK, str(rank.pid)], capture_output=True, text=True,
                              timeout=120).stdout.strip() == ""
        read = subprocess.run([py_spy_binary(), "dump", "--native", "--pid", str(rank.pid)], capture_output=True,
                              text=True, timeout=120)
        assert read.returncode == 0 and "sleep" in read.stdout, read.stdout + read.stderr
    finally:
        rank.kill()
        rank.wait()
