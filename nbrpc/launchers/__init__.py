"""Ways of starting workers, one module each, behind one small protocol (``base.Launcher``).

- ``local``: worker kernels on this machine (the default), all sockets on loopback.
- ``attach``: workers started by anything else with ``nbrpc worker --join``.
- ``ssh``: worker kernels on other hosts started over SSH, joining as ``attach``'s do.
- ``slurm``: workers as the tasks of a Slurm job (or a step of the current
  allocation), joining as ``attach``'s do.

``rendezvous`` (the driver's join service and the worker's side of it) and
``addresses`` (which local address reaches the workers) serve the last three;
``options`` declares every launcher's options once.

A cluster that names no launcher gets local kernels, or the one a server's
administrator names in ``NBRPC_LAUNCHER`` (a hub's ``Spawner.environment``):
``slurm`` on a hub whose servers are Slurm jobs (batchspawner), so that every
``%rpc_init -n 2`` runs its workers as a step of the student's job.

``registry`` holds them as ``Kind`` s (``kinds``): a name, the ``Cluster`` keyword
that asks for it (``attach=N``, ``hosts=...``, ``slurm=...``; none for the default), its
options dataclass and a factory. Another package adds one by an entry point in the
group ``nbrpc.launchers`` that names a ``Kind``, as jupyter_client finds its
provisioners. ``choose`` reads a cluster's options and returns the launcher they ask for.

This ``__init__`` imports nothing, so that ``template`` (the warm template's driver side,
which a notebook's ``import nbrpc`` starts before torch is imported) loads without torch.
"""
