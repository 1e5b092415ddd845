"""The IPython extension: ``%load_ext nbrpc`` registers the RPC magics."""


_cell_output = None
_advice = None


def load_ipython_extension(ipython):
    global _cell_output, _advice
    from ..deploy import template
    from .advice import RpcAdvice
    from .display import CellOutput
    from .magics import RpcMagics

    ipython.register_magics(RpcMagics)
    # torch's "Call init_rpc first" becomes one line that says to run %rpc_init.
    if _advice is None:
        _advice = RpcAdvice()
        _advice.register(ipython)
    # What workers write in calls and background threads shows in the running cell.
    _cell_output = CellOutput()
    _cell_output.register(ipython)
    if template.enabled():
        # A notebook that loads nbrpc runs %rpc_init next: the warm template imports
        # torch and ipykernel while the person types, and the first cluster forks from it.
        template.prestart()


def unload_ipython_extension(ipython):
    # IPython cannot unregister magics; the cluster, if any, keeps running, and its
    # workers' output goes to stdout and stderr, tagged.
    global _cell_output, _advice
    if _advice is not None:
        _advice.unregister(ipython)
        _advice = None
    if _cell_output is not None:
        _cell_output.unregister(ipython)
        _cell_output = None
