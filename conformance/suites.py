"""torch's RPC test suites for the TensorPipe agent, assembled as torch's
``test/distributed/rpc/test_tensorpipe_agent.py`` assembles them (``generate_tests``).

Importing this module first applies the mode ``run.py`` chose (see ``patching``), in the
runner and in every rank torch spawns, before any of torch's test modules is imported.
"""

import os

from conformance import patching

MODE = patching.apply()

# ``NBRPC_CONFORMANCE_TRANSPORTS=uv`` (make test's subset): torch's tests join on the
# transports named, as nbrpc's members join on uv, instead of all of TensorPipe's. shm's
# pollers spin a core per rank while it lives: on 2 cores, the subset took 81 s of CPU, 56 on uv.
# Set before torch's test modules import ``tp_transports`` by name.
TRANSPORTS = [name for name in os.environ.get("NBRPC_CONFORMANCE_TRANSPORTS", "").split(",") if name]
if TRANSPORTS:
    from torch.testing._internal import common_distributed

    common_distributed.tp_transports = lambda: list(TRANSPORTS)

# torch's own modules, not rpc_utils: that one imports the JIT and DDP suites too, which
# script dozens of functions at import, seconds in every rank of every test.
from torch.testing._internal.common_distributed import MultiProcessTestCase  # noqa: E402
from torch.testing._internal.distributed.nn.api.remote_module_test import (  # noqa: E402
    CudaRemoteModuleTest,
    RemoteModuleTest,
)
from torch.testing._internal.distributed.rpc.dist_autograd_test import (  # noqa: E402
    CudaDistAutogradTest,
    DistAutogradTest,
    TensorPipeAgentDistAutogradTest,
    TensorPipeCudaDistAutogradTest,
)
from torch.testing._internal.distributed.rpc.dist_optimizer_test import DistOptimizerTest  # noqa: E402
from torch.testing._internal.distributed.rpc.examples.parameter_server_test import ParameterServerTest  # noqa: E402
from torch.testing._internal.distributed.rpc.examples.reinforcement_learning_rpc_test import (  # noqa: E402
    ReinforcementLearningRpcTest,
)
from torch.testing._internal.distributed.rpc.rpc_test import (  # noqa: E402
    CudaRpcTest,
    RpcTest,
    TensorPipeAgentCudaRpcTest,
    TensorPipeAgentRpcTest,
)
from torch.testing._internal.distributed.rpc.tensorpipe_rpc_agent_test_fixture import (  # noqa: E402
    TensorPipeRpcAgentTestFixture,
)

CPU_SUITES = [
    RpcTest,
    DistAutogradTest,
    DistOptimizerTest,
    ParameterServerTest,
    ReinforcementLearningRpcTest,
    RemoteModuleTest,
    TensorPipeAgentRpcTest,
    TensorPipeAgentDistAutogradTest,
]
CUDA_SUITES = [
    CudaRpcTest,
    CudaDistAutogradTest,
    CudaRemoteModuleTest,
    TensorPipeAgentCudaRpcTest,
    TensorPipeCudaDistAutogradTest,
]
PREFIX = "TensorPipe"


# ``NBRPC_CONFORMANCE_START=forkserver`` (make test's subset, tests/test_conformance.py):
# the ranks start as spawned ones do, from the runner's main module, but from a server
# that imported this module once, patches first as everywhere (the runner's environment
# chose the mode): a rank then finds it imported, not 3.5 s of CPU importing torch, its
# test modules and nbrpc (on 2 loaded cores; the subset starts 64 ranks).
START = os.environ.get("NBRPC_CONFORMANCE_START", "spawn")
PRELOADED = [__name__]


class SpawnHelper(MultiProcessTestCase):
    """torch's ``rpc_utils.SpawnHelper``: each test spawns its ranks (or starts them from a
    forkserver, see ``START``)."""

    def setUp(self):
        super().setUp()
        if START == "spawn":
            self._spawn_processes()
            return
        import torch.multiprocessing

        context = torch.multiprocessing.get_context(START)
        context.set_forkserver_preload(PRELOADED)
        self._start_processes(context.Process)


def _generate() -> dict[str, type]:
    """``rpc_utils.generate_tests`` for the TensorPipe agent."""
    made = {}
    for suite in CPU_SUITES + CUDA_SUITES:
        name = PREFIX + suite.__name__
        made[name] = type(name, (suite, TensorPipeRpcAgentTestFixture, SpawnHelper), {"__module__": __name__})
    return made


globals().update(_generate())
