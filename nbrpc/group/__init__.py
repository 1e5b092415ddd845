"""The driver's RPC group: its members (``membership``) and their devices (``devices``)."""

# TensorPipe's transport unless a cluster asks for another: TCP, idle at no CPU. Named
# here, where no torch is imported, so that the worker settings (and the warm template,
# started while a kernel still imports torch) need none.
DEFAULT_TRANSPORT = "uv"
