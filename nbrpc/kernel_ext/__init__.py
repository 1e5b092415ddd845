"""The IPython extension: ``%load_ext nbrpc`` registers the RPC magics."""


_cell_output = None
_hang_watch = None


def load_ipython_extension(ipython):
    global _cell_output, _hang_watch
    from ..deploy import template
    from .display import CellOutput
    from .hangs import HangWatch
    from .magics import RpcMagics

    ipython.register_magics(RpcMagics)
    # What workers write in calls and background threads shows in the running cell.
    _cell_output = CellOutput()
    _cell_output.register(ipython)
    # A cell stuck on the cluster says on what, by itself.
    _hang_watch = HangWatch()
    _hang_watch.register(ipython)
    if template.enabled():
        # A notebook that loads nbrpc runs %rpc_init next: the warm template imports
        # torch and ipykernel while the person types, and the first cluster forks from it.
        template.prestart()


def hang_watch():
    """The loaded extension's ``HangWatch`` (what a waiting cell shows by itself)."""
    if _hang_watch is None:
        raise RuntimeError("nbrpc's extension is not loaded: %load_ext nbrpc")
    return _hang_watch


def unload_ipython_extension(ipython):
    # IPython cannot unregister magics; the cluster, if any, keeps running, and its
    # workers' output goes to stdout and stderr, tagged.
    global _cell_output, _hang_watch
    if _cell_output is not None:
        _cell_output.unregister(ipython)
        _cell_output = None
    if _hang_watch is not None:
        _hang_watch.unregister(ipython)
        _hang_watch = None
