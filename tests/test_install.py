"""What ``pip install mpinb`` brings: no deep-learning framework unless asked for (``mpinb[torch]``), and
``mpinb.torch`` saying how to install PyTorch where it is missing."""

import importlib.metadata
import re
import subprocess
import sys
import textwrap

from packaging.requirements import Requirement

FRAMEWORKS = {"torch", "tensorflow", "tensorflow-cpu", "jax", "jaxlib"}


def test_pip_install_mpinb_needs_no_deep_learning_framework_and_the_torch_extra_adds_torch():
    requirements = [Requirement(line) for line in importlib.metadata.requires("mpinb")]
    plain = {r.name for r in requirements if r.marker is None}
    assert plain and not plain & FRAMEWORKS, sorted(plain)
    extras = {r.name for r in requirements if r.marker is not None and r.marker.evaluate({"extra": "torch"})}
    assert "torch" in extras, sorted(extras)


def test_mpinb_torch_without_torch_says_how_to_install_it():
    """A Python where ``import torch`` fails, as where it is not installed (a None in sys.modules makes the import
    raise ImportError, as a missing package does)."""
    code = textwrap.dedent("""
        import sys
        sys.modules["torch"] = None
        import mpinb                      # the extension itself needs no torch
        try:
            import mpinb.torch
        except ImportError as exc:
            print("ImportError:", exc)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert re.search(r"ImportError: mpinb.torch needs PyTorch, which is not installed here: pip install "
                     r"'mpinb\[torch\]'", done.stdout), done.stdout
