"""The magics (``%rpc_init``, ``%%rpc_on``, ``%rpc_status``, ``%rpc_stacks``, ``%rpc_waits``, ``%rpc_shutdown``,
``%rref_graph``, ``%autograd_graph``, ``%rpc_timeline``): thin shells over ``Cluster`` and the widgets."""

from __future__ import annotations

import shlex

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from ..cluster import cluster as cluster_mod
from ..cluster import queries
from ..cluster.cluster_options import ClusterOptions
from ..diagnostics import stacks as stacks_mod
from ..drawing.status_table import StatusTable
from ..errors import JobRefusedError, NoClusterError, UnknownWorkerError
from ..launchers import registry
from ..launchers.options import flags
from ..launchers.slurm_options import SlurmOptions
from . import hangs
from .display import KernelOutput, start_progress


def _without_comment(line: str) -> str:
    """``line`` without a trailing ``# comment`` (a ``#`` outside quotes, at the start or
    after a space), as a script's line would read: ``%rpc_init -n 2  # two workers``."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line


def _parse(magic, line: str):
    """``parse_argstring`` that reports bad input as ``UsageError``."""
    try:
        return parse_argstring(magic, _without_comment(line))
    except UsageError:
        raise
    except (SystemExit, ValueError) as e:
        raise UsageError(f"{magic.__name__}: {e}") from e


def _unquoted(value: str) -> str:
    """A value given in quotes (``--ssh "ssh -F cfg"``): IPython keeps the quotes."""
    parts = shlex.split(value)
    return parts[0] if len(parts) == 1 else value


def _device_maps(values: list[str] | None) -> str | None:
    """Every ``--device-map`` as one text map (``devices.parse_device_maps`` reads it)."""
    return ";".join(_unquoted(v) for v in values) if values else None


def _slurm_options(args) -> dict | None:
    """The job's options from ``--slurm`` and its flags (which need it)."""
    given = {name: getattr(args, name) for name, _, _ in flags(SlurmOptions) if getattr(args, name) is not None}
    if "args" in given:
        given["args"] = _unquoted(given["args"])
    if not args.slurm:
        if given and registry.default_name() == "slurm":  # the server's default (NBRPC_LAUNCHER)
            return given
        if given:
            named = ", ".join(flag for name, flag, _ in flags(SlurmOptions) if name in given)
            raise UsageError(f"%rpc_init: {named} {'is' if len(given) == 1 else 'are'} for Slurm jobs: add --slurm")
        return None
    return given


def _option_flags(func):
    """Every flag a ``Cluster`` option or a launcher's option declares (``ClusterOptions``,
    ``launchers.options``), each once; a flag left out is None (the option's default)."""
    seen = set()
    declared = [ClusterOptions, *(kind.options for kind in registry.kinds().values()), SlurmOptions]
    for options_class in declared:
        for name, flag, settings in flags(options_class):
            if name not in seen:
                seen.add(name)
                func = argument(flag, dest=name, **settings)(func)
    return func


def _running() -> cluster_mod.Cluster:
    cluster = cluster_mod.current()
    if cluster is None:
        raise NoClusterError("no cluster is running; start one with %rpc_init -n 2")
    return cluster


@magics_class
class RpcMagics(Magics):
    @magic_arguments()
    @argument("-n", type=int, default=None, help="number of workers, named worker1..workerN (default 2)")
    @argument("--names", default=None, help="comma-separated worker names, e.g. ps,trainer1,trainer2")
    @argument("--driver-name", default=None,
              help="RPC name of this kernel (rank 0); default: the name it already has, else master")
    @argument("--no-track", action="store_true", help="do not record RRefs (no %%rref_graph, no snapshots)")
    @argument("--trace", action="store_true",
              help="record every RPC on every member (nbrpc.trace_snapshot(), the timeline)")
    @argument("--gpus", action="store_true",
              help="one GPU per worker (round-robin, this kernel on cuda:0), device maps between all pairs")
    @argument("--device-map", action="append", default=None, metavar="MAP",
              help='[SOURCE->]TARGET=FROM:TO[,FROM:TO]; repeat the flag or join maps with ";", '
                   'e.g. "worker1=0:1" or "worker1=0:1;worker1->worker2=1:0"')
    @_option_flags
    @line_cell_magic
    def rpc_init(self, line: str, cell: str | None = None):
        """Start worker kernels and join them with this kernel in one torch RPC group.

        In the cell form the body runs on every worker, then here, once RPC is up.
        """
        args = _parse(self.rpc_init, line)
        slurm = _slurm_options(args)
        declared = {name for options_class in (ClusterOptions, *(k.options for k in registry.kinds().values()))
                    for name, _, _ in flags(options_class)} - {"slurm"}
        # Options left out take their defaults (each declared once, in its dataclass).
        given = {name: getattr(args, name) for name in declared if getattr(args, name) is not None}
        if given.get("ssh") is not None:
            given["ssh"] = _unquoted(given["ssh"])
        try:
            cluster = cluster_mod.Cluster(
                args.n, names=args.names, driver_name=args.driver_name, slurm=slurm,
                progress=start_progress(), track=not args.no_track, trace=args.trace,
                gpus=args.gpus, device_maps=_device_maps(args.device_map), **given,
            )
        except ValueError as e:
            raise UsageError(f"%rpc_init: {e}") from e
        try:
            cluster.start()
        except JobRefusedError as e:
            raise UsageError(f"%rpc_init: {e}") from e
        if cell and cell.strip():
            cluster.run(cell, "all", KernelOutput())
            self.shell.run_cell(cell, store_history=False)

    @magic_arguments()
    @argument("targets", help="worker name, comma-separated names (a,b), or all")
    @cell_magic
    def rpc_on(self, line: str, cell: str):
        """Run this cell on the named worker kernels; their output streams here."""
        args = _parse(self.rpc_on, line)
        _running().run(cell, args.targets, KernelOutput())

    @line_magic
    def rpc_status(self, line: str = ""):
        """Show every member: name, rank, host, pid, state, devices, busy threads, owned RRefs."""
        if _without_comment(line).strip():
            raise UsageError("%rpc_status takes no arguments")
        return StatusTable(_running().status())

    @magic_arguments()
    @argument("members", nargs="*", help="member names, comma- or space-separated (default: all)")
    @line_magic
    def rpc_stacks(self, line: str = ""):
        """Show the Python stack of every thread of every member (or of the named ones),
        also while every RPC thread is blocked; nbrpc's and torch's frames folded."""
        args = _parse(self.rpc_stacks, line)
        names = [n for part in args.members for n in part.split(",") if n] or None
        try:
            found = queries.stacks(_running(), names)
        except UnknownWorkerError as e:
            raise UsageError(f"%rpc_stacks: {e}") from None
        print(stacks_mod.format_stacks(found))

    @magic_arguments()
    @argument("--show", choices=("findings", "always"), default=None,
              help="what a cell that waits on the cluster for 1 s shows by itself: the hangs found "
                   "(findings, the default), or its pending calls too (always)")
    @argument("--graph", action="store_true",
              help="draw them as a live wait-for graph (lanes per member, an arrow per pending call, "
                   "the hangs in red), refreshing also while later cells wait")
    @argument("--static", action="store_true", help="with --graph: draw once as SVG, no refreshing")
    @argument("--interval", type=float, default=None, help="with --graph: seconds between refreshes (default 1)")
    @line_magic
    def rpc_waits(self, line: str = ""):
        """Show the cluster's pending calls and the hangs found now (``nbrpc.waits()``),
        as text or (``--graph``) as a live wait-for graph."""
        from .extension import Extension

        args = _parse(self.rpc_waits, line)
        if (args.static or args.interval is not None) and not args.graph:
            raise UsageError("%rpc_waits: --static and --interval go with --graph")
        if args.graph:
            return self._waits_graph(args)
        if args.show is not None:
            Extension.of(self.shell).hang_watch.always = args.show == "always"
            print(f"nbrpc: a waiting cell shows {'its pending calls and ' if args.show == 'always' else ''}"
                  "the hangs found")
            return
        snap = queries.waits(_running())
        print(hangs.Report(snap["findings"], snap["calls"]) if snap["calls"] else "nbrpc: no call is pending")

    def _waits_graph(self, args):
        if args.show is not None:
            raise UsageError("%rpc_waits: --show and --graph are separate uses; give one")
        interval = 1.0 if args.interval is None else args.interval
        if not interval > 0:
            raise UsageError(f"%rpc_waits: --interval must be a positive number of seconds, got {interval:g}")
        _running()
        from ..widgets.waits_graph import WaitsGraph, waits_static

        return waits_static() if args.static else WaitsGraph(interval=interval)

    @line_magic
    def rpc_shutdown(self, line: str = ""):
        """Stop RPC everywhere and end every worker process."""
        if _without_comment(line).strip():
            raise UsageError("%rpc_shutdown takes no arguments")
        cluster = cluster_mod.current()
        if cluster is None:
            print("nbrpc: no cluster is running")
            return
        cluster.shutdown()
        print(f"nbrpc: {cluster._summary()} shut down")

    @magic_arguments()
    @argument("--interval", type=float, default=1.0, help="seconds between refreshes (default 1)")
    @argument("--static", action="store_true", help="draw once as SVG, no widget, no refreshing")
    @line_magic
    def rref_graph(self, line: str = ""):
        """Show the running cluster's RRefs: owner lanes, holders, fork history; live."""
        args = _parse(self.rref_graph, line)
        if not args.interval > 0:
            raise UsageError(f"%rref_graph: --interval must be a positive number of seconds, "
                             f"got {args.interval:g}")
        _running()
        from ..widgets.rref_graph import RRefGraph, rref_static

        return rref_static() if args.static else RRefGraph(interval=args.interval)

    @magic_arguments()
    @argument("context_id", nargs="?", type=int, default=None,
              help="a distributed autograd context id (default: the last one "
                   "nbrpc.record_autograd() recorded)")
    @argument("--static", action="store_true", help="draw as SVG, no widget")
    @line_magic
    def autograd_graph(self, line: str = ""):
        """Show a distributed autograd context's graph: a layered DAG per worker."""
        args = _parse(self.autograd_graph, line)
        from ..widgets.autograd_graph import AutogradGraph, autograd_static

        return (autograd_static if args.static else AutogradGraph)(args.context_id)

    @magic_arguments()
    @argument("--last", type=float, default=None, metavar="SECONDS",
              help="only the calls sent in the last SECONDS (default: the whole recording)")
    @argument("--live", action="store_true",
              help="refresh every second, also while a cell runs, following the newest calls")
    @argument("--threads", action="store_true", help="one lane per RPC thread of each member")
    @argument("--static", action="store_true", help="draw once as SVG, no widget")
    @line_magic
    def rpc_timeline(self, line: str = ""):
        """Show the running cluster's recorded RPCs (``%rpc_init --trace``) on a timeline."""
        args = _parse(self.rpc_timeline, line)
        if args.last is not None and not args.last > 0:
            raise UsageError(f"%rpc_timeline: --last must be a positive number of seconds, got {args.last:g}")
        if args.static and args.live:
            raise UsageError("%rpc_timeline: --static draws once; leave out --live or --static")
        _running()
        from ..widgets.timeline import Timeline, TimelineStatic, running_recording

        if args.static:
            return TimelineStatic(running_recording(args.last), threads=args.threads)
        return Timeline(last=args.last, live=args.live, threads=args.threads)
