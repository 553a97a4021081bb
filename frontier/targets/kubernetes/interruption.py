"""Spot nodes on Kubernetes: what a stack must hold for its pods to drain within the notice.

**The choice: the AWS Node Termination Handler in queue mode**, not Karpenter's interruption queue.
Frontier's EKS node pools are managed node groups (infra/eks.py), not Karpenter NodePools, and
Karpenter acts only on the nodes it launched itself; NTH's queue processor acts on any node of the
cluster whose EC2 instance gets a notice. It reads the stack's notice queue (the EventBridge rule of
infra/interruptions.py: spot interruption warnings, rebalance recommendations) and cordons and
drains the node, evicting each pod through the Kubernetes eviction API — so the pool's
PodDisruptionBudget holds (``maxUnavailable``: a rollout batch) and each pod gets its preStop and
its termination grace period. It is installed with the cluster's add-ons (infra/addons.py) wherever
a node group buys spot.

**Sized to the notice:** a pod's termination takes its preStop sleep (the load balancer's
deregistration delay) plus the runtime's drain plus a margin (``manifests.grace_period_s``). On a spot
node all of it must fit in the two minutes between the notice and the instance's end, less the time
NTH takes to see the message and evict (``HANDLER_REACTION_S``); a stack whose pool runs on spot nodes
with a longer termination is refused, naming the settings that make it up.

EKS managed node groups buy one capacity type each, so on this target a spot group is all spot: an
on-demand base (or share) needs a second, on-demand node group, and is refused here rather than
accepted and not built. Capacity Blocks are built on EC2 node groups only (infra/interruptions.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from frontier_settings import FieldProblem

from frontier.config.purchase import CapacityBlock, SpotCapacity
from frontier.config.schema import Settings
from frontier.targets.kubernetes.manifests import GRACE_MARGIN_S, pre_stop_s

# EC2's spot interruption notice: the instance goes two minutes after it.
SPOT_NOTICE_S = 120
# Allowed from the notice to the evictions: EventBridge to SQS, NTH's receive (it long-polls), the
# node's cordon and the eviction calls. A budget, not a measurement: no cluster runs here.
HANDLER_REACTION_S = 10


def termination_budget_s() -> int:
    """The longest a pod on a spot node may take to terminate."""
    return SPOT_NOTICE_S - HANDLER_REACTION_S


def interruption_problems(s: Settings) -> Iterator[FieldProblem]:
    for i, group in enumerate(s.node_groups):
        where = f"node_groups[{i}].capacity"
        capacity = group.capacity
        if isinstance(capacity, CapacityBlock):
            yield FieldProblem(
                f"{where}.market",
                capacity.market,
                "Capacity Blocks are built on EC2 node groups only (target 'ec2'); EKS managed node "
                "groups here buy on-demand or spot",
            )
        if not isinstance(capacity, SpotCapacity):
            continue
        for name in ("on_demand_base", "on_demand_above_base_percent"):
            value = getattr(capacity, name)
            if value:
                yield FieldProblem(
                    f"{where}.{name}",
                    value,
                    "must be 0 on kubernetes: an EKS managed node group buys one capacity type, so a "
                    "spot group is all spot; put the on-demand base in a node group of its own",
                )
        for pool in s.pools_on(group):
            # manifests.grace_period_s of the pool's view, from the pool it is handed: the pod's
            # preStop (the deregistration delay), the runtime's drain, the margin.
            drain = pool.runtime.drain_timeout_s
            took = pre_stop_s(s) + math.ceil(drain) + GRACE_MARGIN_S
            if took > termination_budget_s():
                yield FieldProblem(
                    "rollout.deregistration_delay_s",
                    s.rollout.deregistration_delay_s,
                    f"with runtime.drain_timeout_s ({drain:g}) and a {GRACE_MARGIN_S} s margin, a pod of "
                    f"model {pool.name!r} on spot group {group.name!r} takes up to {took} s to terminate "
                    f"(preStop {pre_stop_s(s)} s + drain + margin); a spot node is gone {SPOT_NOTICE_S} s "
                    f"after its notice, so it must be at most {termination_budget_s()} s (the notice less "
                    f"{HANDLER_REACTION_S} s for the termination handler to evict it)",
                )
