"""The IPython extension: ``%load_ext nbrpc`` registers the RPC magics."""


def load_ipython_extension(ipython):
    from .extension import Extension
    from .magics import RpcMagics

    ipython.register_magics(RpcMagics)
    Extension.load(ipython)


def unload_ipython_extension(ipython):
    from .extension import Extension

    extension = Extension.loaded.get(id(ipython))
    if extension is not None:
        extension.unload()
