"""Ranks started by one ``mpiexec`` this kernel runs: on this host (``mpi``; with a hostfile, also on the hosts
listed there), or on hosts it reaches over ssh (``ssh``)."""

from ....errors import BadArguments
from .. import ipp
from .base import Launcher


class Mpiexec(Launcher):
    """``mpiexec`` on this host, and on the hosts of ``--hostfile`` if one is given."""

    name = "mpi"

    def configure(self, config, *, mpiexec, mpiexec_args, engine_cmd, environment, workdir):
        config.MPILauncher.mpi_cmd = [mpiexec]
        config.MPILauncher.mpi_args = list(mpiexec_args) + self.placement.hostfile_args()
        config.MPIEngineSetLauncher.engine_cmd = engine_cmd
        config.MPIEngineSetLauncher.environment = environment
        return ipp.MPIEngines


class Ssh(Mpiexec):
    """``mpiexec`` that reaches the hosts of ``--hostfile`` over ssh: a hostfile is required."""

    name = "ssh"

    def validate(self):
        if not self.placement.hostfile:
            raise BadArguments("--launcher ssh needs --hostfile FILE: the hosts mpiexec starts ranks on over ssh")
        super().validate()
