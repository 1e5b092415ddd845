"""What a shared server (a JupyterHub, a machine with several users) needs beyond one
user's machine.

- ``kernel``: the nbrpc kernel, ipykernel in a user namespace of its own (run by path,
  before this package can be imported).
- ``private_network``: a local cluster's RPC in a network namespace of its own.
- ``limits``: the per-user limits a server's administrator sets.
- ``scratch``: the private temporary folders nbrpc makes, and sweeping the stale ones.
"""
