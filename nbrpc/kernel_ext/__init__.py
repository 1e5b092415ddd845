"""The IPython extension: ``%load_ext nbrpc`` registers the RPC magics."""


def load_ipython_extension(ipython):
    from .magics import RpcMagics

    ipython.register_magics(RpcMagics)


def unload_ipython_extension(ipython):
    # IPython cannot unregister magics; the cluster, if any, keeps running.
    pass
