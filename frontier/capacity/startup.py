"""How long a new host of a node group takes to serve: what its scaling policies wait before counting it.

EC2 Auto Scaling's ``estimated_instance_warmup`` is the seconds after a launch during which a new
host's metrics are not yet added to the group's: too short, and a policy that sees the queue still
long while replicas load launches more hosts for the same load; too long, and a real rise in load
waits for hosts that already serve. A group's ``instance_warmup_s`` sets it. Unset, it is estimated
from the pools that run on the group:

    boot + COLD_START_RATIO x max(B / (concurrency x S3_CONNECTION_BYTES_PER_S)) over the pools

``B`` is a pool's weights (``frontier.config.memory.weights_bytes``) and ``concurrency`` its
``runtime.weights_fetch_concurrency``: the network bound of a start from S3, at the rate S3 gives
one connection. ``COLD_START_RATIO`` is what ``bench/cold_start.py`` measured for start-to-ready
over the machine's bound (S3 with prepared weights, the median of four runs; docs/operate.md), and
``HOST_BOOT_S`` an allowance for what comes before the runtime starts (the instance's launch,
cloud-init, the driver check and the image pull), which cannot be measured without EC2. Each start
publishes what it took, phase by phase (``StartupSeconds``, ``frontier_hostside.node_boot``): set
``instance_warmup_s`` from the Maximum of its ``ready`` phase plus the boot, once a group has
started hosts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from frontier.config.memory import weights_bytes
from frontier.config.schema import NodeGroup, Settings

#: bench/cold_start.py: start-to-ready over the machine's bound, from S3 with prepared weights: the
#: median of four runs at load 8-14 (0.95 at load 3.4-6.4; docs/operate.md). The slower figure: a
#: warm-up too short launches hosts for a queue that the replicas still loading will serve.
COLD_START_RATIO = 1.97
#: What S3 gives one connection (runtime/frontier_runtime/config.py, WEIGHTS_FETCH_CONCURRENCY).
S3_CONNECTION_BYTES_PER_S = 100e6
#: Launch to the runtime's start: the instance's boot, cloud-init, the driver check, the image pull.
HOST_BOOT_S = 180


@dataclass(frozen=True)
class StartupEstimate:
    """A group's warm-up in seconds, and where it came from."""

    seconds: int
    #: "setting" (the group's instance_warmup_s) or "estimate" (from its pools' weights).
    source: str
    #: The runtime's start-to-ready within it (0 where the setting gives the whole).
    runtime_s: float = 0.0


def instance_warmup(settings: Settings, group: NodeGroup) -> StartupEstimate:
    """The seconds a new host of ``group`` takes to serve: its setting, else the estimate above."""
    if group.instance_warmup_s is not None:
        return StartupEstimate(group.instance_warmup_s, "setting")
    runtime_s = max(
        (
            COLD_START_RATIO
            * weights_bytes(pool.model)
            / (pool.runtime_on(group).weights_fetch_concurrency * S3_CONNECTION_BYTES_PER_S)
            for pool in settings.pools_on(group)
        ),
        default=0.0,
    )
    return StartupEstimate(math.ceil(HOST_BOOT_S + runtime_s), "estimate", runtime_s)
