"""The ``nbrpc`` command: ``nbrpc run NOTEBOOK`` executes a notebook headless;
``nbrpc worker --join HOST:PORT --token TOKEN`` joins a driver's cluster as a worker;
``nbrpc sweep`` removes this user's nbrpc folders that no running process uses;
``nbrpc kernelspec`` installs the nbrpc kernel (local clusters in a private network)."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

from .settings import join_token


def run_notebook(path: str, output: str, timeout: int = 600) -> float:
    """Execute ``path`` top to bottom in a fresh kernel, save it to ``output``.

    Widget state is not stored, so viewers without a kernel (GitHub, nbviewer) show
    each widget's static fallback rather than a blank widget.
    """
    import nbformat
    from jupyter_client import AsyncKernelManager
    from jupyter_core.utils import run_sync
    from nbclient import NotebookClient

    from .shared_server import scratch

    notebook = nbformat.read(path, as_version=4)
    # The kernel on Unix sockets in a folder only this user can enter, not on TCP ports.
    sockets = scratch.make("run", sockets=True)
    kernel = AsyncKernelManager(kernel_name="python3", transport="ipc",
                                ip=os.path.join(sockets, "kernel"))
    client = NotebookClient(
        notebook, km=kernel, timeout=timeout, kernel_name="python3", store_widget_state=False,
        resources={"metadata": {"path": os.path.dirname(os.path.abspath(path))}},
    )
    began = time.monotonic()
    try:
        client.execute()
    finally:
        if kernel.has_kernel:  # a kernel manager passed in is the caller's to end
            run_sync(kernel.shutdown_kernel)(now=True)
        shutil.rmtree(sockets, ignore_errors=True)
        os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
        nbformat.write(notebook, output)
    return time.monotonic() - began


def join_as_worker(address: str, token: str, name: str | None) -> int:
    """Run as a worker of the driver at ``address`` until it ends the cluster."""
    from .errors import JoinRefusedError
    from .member.worker import join_driver

    if token == "-":
        token = sys.stdin.readline().strip()
    try:
        join_driver(address, token, name)
    except (JoinRefusedError, ConnectionError, ValueError) as e:
        print(f"nbrpc worker: {e}", file=sys.stderr)
        return 2
    return 0


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nbrpc", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="execute a notebook headless and save the result")
    run.add_argument("notebook")
    run.add_argument("--output", help="where to save the executed notebook (default: build/NAME)")
    run.add_argument("--timeout", type=int, default=600, help="seconds allowed per cell")
    worker = commands.add_parser(
        "worker", help="join a driver's cluster as a worker kernel (%%rpc_init --attach prints the command)")
    worker.add_argument("--join", required=True, metavar="HOST:PORT", help="the driver's rendezvous address")
    worker.add_argument("--token", default=join_token(),
                        help="the cluster's token ('-': read it from stdin; default: $NBRPC_TOKEN)")
    worker.add_argument("--name", default=None, help="this worker's RPC name (default: one the driver picks)")
    spec = commands.add_parser(
        "kernelspec", help="install the nbrpc kernel spec, 'Python 3 (nbrpc)': its local clusters get a "
                           "private network no other user of the machine can reach")
    where = spec.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="for this user only")
    where.add_argument("--sys-prefix", action="store_true", help="in this environment (sys.prefix)")
    where.add_argument("--prefix", default=None, help="under this prefix (default: system-wide)")
    commands.add_parser(
        "sweep", help="remove this user's nbrpc folders (kernel connection files, sockets, logs) "
                      "that no running process uses, as the next cluster's start does")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "worker":
        return join_as_worker(args.join, args.token, args.name)
    if args.command == "kernelspec":
        from .shared_server import kernel

        prefix = sys.prefix if args.sys_prefix else args.prefix
        print(f"nbrpc: installed the kernel spec {kernel.NAME!r} in {kernel.install(args.user, prefix)}")
        return 0
    if args.command == "sweep":
        from .shared_server import scratch

        removed = scratch.sweep()
        print(f"nbrpc: removed {len(removed)} stale folder{'s' * (len(removed) != 1)}"
              + "".join(f"\n  {f}" for f in removed))
        return 0
    output = args.output or os.path.join("build", os.path.basename(args.notebook))
    seconds = run_notebook(args.notebook, output, args.timeout)
    print(f"nbrpc: ran {args.notebook} in {seconds:.1f} s; executed notebook: {os.path.abspath(output)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
