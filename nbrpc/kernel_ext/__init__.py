"""The IPython extension: ``%load_ext nbrpc`` registers the RPC magics."""


def load_ipython_extension(ipython):
    from ..deploy import template
    from .magics import RpcMagics

    ipython.register_magics(RpcMagics)
    if template.enabled():
        # A notebook that loads nbrpc runs %rpc_init next: the warm template imports
        # torch and ipykernel while the person types, and the first cluster forks from it.
        template.prestart()


def unload_ipython_extension(ipython):
    # IPython cannot unregister magics; the cluster, if any, keeps running.
    pass
