"""Kernels on Unix sockets for the harnesses that start notebook kernels: the tests'
own, nbval's (a pytest plugin: ``-p tests.unix_socket_kernels``) and nbgrader's (a
course's config with ``nbgrader_config()`` added).

jupyter_client picks a kernel's TCP ports by binding port 0 and letting go, and the
kernel binds them later: seconds later at the idle priority, beside the serial tests.
Any process on the machine can take one meanwhile (a listener, an outgoing connection),
and the kernel then exits with "Address already in use"; its harness reports "Kernel
died before replying to kernel_info". A Unix socket in a folder of the kernel's own is
taken by no one else, as nbrpc's workers' are. This module imports neither torch nor
nbrpc: nbval's and nbgrader's processes load it.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from jupyter_client import AsyncKernelManager, KernelManager
from traitlets import default

# A Unix socket's path fits in 107 bytes: the folder goes under /tmp, not a deep $TMPDIR.
SOCKETS_BASE = "/tmp"


class UnixSockets:
    """A local kernel whose sockets are files in a private folder of its own (``ip``),
    removed with the kernel's connection file when it shuts down."""

    @default("transport")
    def _transport_default(self) -> str:
        return "ipc"

    sockets_folder: str | None = None  # made with the first look at ``ip``

    def _ip_default(self) -> str:  # jupyter_client's dynamic default, by its name
        if self.transport != "ipc":
            return super()._ip_default()
        self.sockets_folder = tempfile.mkdtemp(prefix="kernel-", dir=SOCKETS_BASE)
        return os.path.join(self.sockets_folder, "kernel")

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        await super()._async_cleanup_resources(restart=restart)
        if not restart:
            self.remove_sockets_folder()

    def remove_sockets_folder(self) -> None:
        if self.sockets_folder is not None:
            shutil.rmtree(self.sockets_folder, ignore_errors=True)


class UnixSocketKernelManager(UnixSockets, KernelManager):
    """For a blocking client: the tests' own kernels and nbval's."""


class AsyncUnixSocketKernelManager(UnixSockets, AsyncKernelManager):
    """For nbclient, which awaits its kernel's client (nbgrader's grading): with a blocking
    one, a cell that runs into its time limit is never stopped."""


def nbgrader_config() -> str:
    """The lines that give an nbgrader course's grading kernels this module's manager."""
    here = os.path.dirname(os.path.abspath(__file__))
    return (f"\nimport sys\nsys.path.insert(0, {here!r})\n"
            'c.NotebookClient.kernel_manager_class = "unix_socket_kernels.AsyncUnixSocketKernelManager"\n')


def pytest_configure(config) -> None:
    """nbval starts each notebook's kernel with this manager (it takes no manager class of
    its own: its module's name for jupyter_client's is replaced)."""
    if config.pluginmanager.hasplugin("nbval"):
        import nbval.kernel

        nbval.kernel.KernelManager = UnixSocketKernelManager
