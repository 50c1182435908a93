"""A launcher a package adds: found through its ``mpinb.launchers`` entry point, by name, and starting a real world."""

import textwrap

import pytest
from conftest import leftover_ranks, new_world_tag

from mpinb.errors import BadArguments
from mpinb.notebook.world import launchers

TOY = textwrap.dedent('''
    """mpiexec here, under another name, marking the ranks' environment."""

    from mpinb.notebook.world.launchers import Mpiexec


    class Toy(Mpiexec):
        name = "toy"

        def configure(self, config, *, environment, **rest):
            return super().configure(config, environment={**environment, "TOY_LAUNCHER": "yes"}, **rest)

        def describe(self, job_id=None):
            return "the toy launcher"
''')


@pytest.fixture
def toy_package(tmp_path, monkeypatch):
    """An installed distribution, as pip leaves one: its module, and its metadata naming the entry point."""
    (tmp_path / "toy_launcher.py").write_text(TOY)
    info = tmp_path / "toy_launcher-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-launcher\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{launchers.GROUP}]\ntoy = toy_launcher:Toy\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    monkeypatch.delitem(__import__("sys").modules, "toy_launcher", raising=False)


def test_a_launcher_is_found_by_the_name_its_entry_point_gives(toy_package):
    assert "toy" in launchers.names()
    assert launchers.resolve("toy").__module__ == "toy_launcher"
    assert launchers.Placement(launcher="toy").describe() == "the toy launcher"


def test_an_entry_point_that_is_no_launcher_is_refused(toy_package, tmp_path):
    info = tmp_path / "toy_launcher-0.1.dist-info"
    (info / "entry_points.txt").write_text(f"[{launchers.GROUP}]\nodd = os:path\n")
    with pytest.raises(BadArguments, match="is not a Launcher class"):
        launchers.resolve("odd")


@pytest.mark.mpi
@pytest.mark.slow
def test_a_world_starts_with_a_launcher_a_package_added(toy_package, ip, magics, mpi, no_world, capsys):
    tag = new_world_tag()
    ip.run_line_magic("mpi", "start -n 2 --launcher toy")
    assert mpi("import os\nos.environ.get('TOY_LAUNCHER'), comm.allreduce(rank)") == {0: ("yes", 1), 1: ("yes", 1)}
    ip.run_line_magic("mpi", "status")
    assert "on the toy launcher" in capsys.readouterr().out
    ip.run_line_magic("mpi", "stop")
    assert leftover_ranks(tag) == []
