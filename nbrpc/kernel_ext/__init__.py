"""The IPython extension: ``%load_ext nbrpc`` registers the RPC magics."""


# Each shell's CellOutput, HangWatch and RpcAdvice, by the shell's id (one in a kernel).
_cell_outputs: dict = {}
_hang_watches: dict = {}
_advice: dict = {}
_panels: dict = {}


def load_ipython_extension(ipython):
    from ..deploy import template
    from .advice import RpcAdvice
    from .display import CellOutput
    from .hangs import HangWatch
    from .magics import RpcMagics
    from .panel import Panel

    ipython.register_magics(RpcMagics)
    # torch's "Call init_rpc first" becomes one line that says to run %rpc_init.
    if id(ipython) not in _advice:
        _advice[id(ipython)] = advice = RpcAdvice()
        advice.register(ipython)
    # What workers write in calls and background threads shows in the running cell.
    _cell_outputs[id(ipython)] = cell_output = CellOutput()
    cell_output.register(ipython)
    # A cell stuck on the cluster says on what, by itself.
    _hang_watches[id(ipython)] = watch = HangWatch()
    watch.register(ipython)
    # JupyterLab's side panel asks this kernel about its cluster on the control channel.
    if id(ipython) not in _panels:
        _panels[id(ipython)] = panel = Panel()
        panel.register(ipython)
    if template.enabled():
        # A notebook that loads nbrpc runs %rpc_init next: the warm template imports
        # torch and ipykernel while the person types, and the first cluster forks from it.
        template.prestart()


def hang_watch(ipython=None):
    """The loaded extension's ``HangWatch`` in ``ipython`` (the running shell by default)."""
    if ipython is None:
        from IPython import get_ipython

        ipython = get_ipython()
    watch = _hang_watches.get(id(ipython))
    if watch is None:
        raise RuntimeError("nbrpc's extension is not loaded: %load_ext nbrpc")
    return watch


def unload_ipython_extension(ipython):
    # IPython cannot unregister magics; the cluster, if any, keeps running, and its
    # workers' output goes to stdout and stderr, tagged.
    advice = _advice.pop(id(ipython), None)
    if advice is not None:
        advice.unregister(ipython)
    cell_output = _cell_outputs.pop(id(ipython), None)
    if cell_output is not None:
        cell_output.unregister(ipython)
    watch = _hang_watches.pop(id(ipython), None)
    if watch is not None:
        watch.unregister(ipython)
    panel = _panels.pop(id(ipython), None)
    if panel is not None:
        panel.unregister(ipython)
