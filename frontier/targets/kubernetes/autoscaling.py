"""Autoscaling of the runtime: a KEDA ScaledObject on its queue depth.

**KEDA, not an HPA on an external metric.** The signal is the runtime's queue depth
(``vllm:num_requests_waiting``), which Prometheus already scrapes. An HPA can only read it through
an adapter (prometheus-adapter) with a rule per metric, a second component to run and keep in step
with the query; KEDA's ScaledObject carries the PromQL query itself, next to the threshold, and
drives the same HPA machinery underneath (behavior, stabilisation). Scale-down is one replica per
period, slower than the runtime's drain, so load moves off a replica before it goes.

**Not the queue alone.** At any steady load nothing waits, and an HPA on the queue alone asks for
ceil(0 / target) replicas: the fleet would fall to its minimum and the queue come back. A second
trigger holds the requests running at ``scale_in_utilisation`` of each replica's concurrency
(``node_groups[].scale_in_utilisation`` x ``runtime.max_concurrency``); the HPA takes the larger of
the two, so a replica goes only when the rest would carry what runs at that share — the rule the
EC2 group (infra/scale_in.py) and the local autoscaler scale in by. Unlike theirs it also scales out
above that share, as target tracking does.

A disaggregated pool's halves scale apart, each on its own signal (:func:`load_triggers`).

A pool whose replica spans several nodes is scaled the same way through its LeaderWorkerSet's
scale subresource (``spec.replicas``: groups, one replica each; the HPA selector LWS publishes
matches the leaders, which are the pods that serve and report the queue).
"""

from __future__ import annotations

import math

from frontier_gateway.hold import POOL_LABEL, POOL_WAITING_METRIC
from frontier_hostside.names import READY_METRIC, RUNNING_METRIC, TTFT_METRIC, WAITING_METRIC

from frontier.config.schedule import cron_of
from frontier.config.schema import PoolSettings, Settings
from frontier.targets.kubernetes import leader_workers as lw
from frontier.targets.kubernetes.objects import Manifest, app_labels, app_name, kubernetes_of, kv_role


def queue_depth_query(settings: Settings, pool: PoolSettings) -> str:
    k = kubernetes_of(settings)
    return f'sum({WAITING_METRIC}{{namespace="{k.namespace}",service="{app_name(pool)}"}})'


def running_query(settings: Settings, pool: PoolSettings) -> str:
    k = kubernetes_of(settings)
    return f'sum({RUNNING_METRIC}{{namespace="{k.namespace}",service="{app_name(pool)}"}})'


#: The window the TTFT p90 is taken over: four of Prometheus's usual 30 s scrapes at least, so one
#: slow request in a quiet minute does not read as a p90.
TTFT_WINDOW = "2m"


def ttft_p90_query(settings: Settings, pool: PoolSettings) -> str:
    """The pool's TTFT p90 (seconds) from the runtimes' histogram; no traffic (NaN) reads as 0, as
    ``> 0`` drops a NaN sample and ``or vector(0)`` stands in."""
    k = kubernetes_of(settings)
    selector = f'{{namespace="{k.namespace}",service="{app_name(pool)}"}}'
    rate = f"rate({TTFT_METRIC}_bucket{selector}[{TTFT_WINDOW}])"
    return f"(histogram_quantile(0.9, sum by (le) ({rate})) > 0) or vector(0)"


def ttft_replicas_query(settings: Settings, pool: PoolSettings) -> str:
    """The ready replicas times the pool's TTFT p90: over the SLO as an ``AverageValue`` target, the
    HPA asks ready x p90 / SLO replicas. Ready ones only: pods still loading serve nothing yet, and
    counting them (as a ``Value`` metric's current x p90 / SLO does) would ask for more replicas at
    every scrape while the new ones load, for the same latency."""
    k = kubernetes_of(settings)
    ready = f'sum({READY_METRIC}{{namespace="{k.namespace}",service="{app_name(pool)}"}})'
    return f"({ready} * ({ttft_p90_query(settings, pool)})) or vector(0)"


def running_threshold(pool: PoolSettings) -> float:
    """Requests one replica runs at its group's ``scale_in_utilisation`` of its concurrency."""
    return pool.runtime.max_concurrency * pool.group.scale_in_utilisation


def scaled_object(settings: Settings, pool: PoolSettings) -> Manifest:
    """The ScaledObject of ``pool``'s runtime workload (or of one half's of a disaggregated pool:
    see :func:`load_triggers` and :func:`replica_counts`)."""
    k = kubernetes_of(settings)
    auto = k.autoscaling
    body = {
        "spec": {
            "scaleTargetRef": scale_target(pool),
            "pollingInterval": auto.polling_interval_s,
            # KEDA's cooldownPeriod is how long every trigger must be inactive before it scales to
            # zero: the stack's idle_to_zero_s where the group may reach zero.
            "cooldownPeriod": idle_to_zero_s(pool) or auto.cooldown_s,
            **replica_counts(settings, pool),
            "maxReplicaCount": auto.max_replicas,
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {
                        "scaleUp": {
                            "stabilizationWindowSeconds": 0,
                            "policies": [{"type": "Pods", "value": 2, "periodSeconds": 60}],
                        },
                        "scaleDown": {
                            "stabilizationWindowSeconds": auto.cooldown_s,
                            "policies": [{"type": "Pods", "value": 1, "periodSeconds": auto.cooldown_s}],
                        },
                    }
                }
            },
            "triggers": [
                *load_triggers(settings, pool),
                *schedule_triggers(pool),
                *demand_triggers(settings, pool),
            ],
        }
    }
    return Manifest(
        "keda.sh/v1alpha1", "ScaledObject", app_name(pool), k.namespace, body, labels=app_labels(pool)
    )


def load_triggers(settings: Settings, pool: PoolSettings) -> list[dict[str, object]]:
    """The pool's load signals: prompts waiting, requests running, and the latency users see. A
    disaggregated pool's halves take theirs: a prefill replica holds a request only for its prompt,
    so what it owes is the prompts waiting for it and their first token; a decode replica holds
    each stream to its end, so its load is the streams running (at ``scale_in_utilisation`` of its
    concurrency, which also keeps it from falling to its floor whenever nothing waits).

    The latency trigger scales out when the pool's TTFT p90 passes the stack's ``slo.ttft_ms``,
    whatever the queue says: long prompts can slow first tokens with few requests waiting. The HPA
    asks ready x p90 / threshold replicas of it (:func:`ttft_replicas_query`), so under the SLO it
    asks for fewer replicas than run and the HPA, taking the largest proposal, leaves scale-in to the
    running trigger; and while the replicas it asked for load, it asks for no more."""
    auto = kubernetes_of(settings).autoscaling
    queue = {
        "type": "prometheus",
        "name": "queue-depth",
        "metricType": "AverageValue",
        # KEDA reads trigger metadata as strings only.
        "metadata": {
            "serverAddress": auto.prometheus_url,
            "query": queue_depth_query(settings, pool),
            "threshold": str(auto.target_queue_depth),
        },
    }
    running = {
        "type": "prometheus",
        "name": "running",
        "metricType": "AverageValue",
        "metadata": {
            "serverAddress": auto.prometheus_url,
            "query": running_query(settings, pool),
            "threshold": f"{running_threshold(pool):g}",
        },
    }
    latency = {
        "type": "prometheus",
        "name": "ttft-p90",
        "metricType": "AverageValue",
        "metadata": {
            "serverAddress": auto.prometheus_url,
            "query": ttft_replicas_query(settings, pool),
            "threshold": f"{settings.slo.ttft_ms / 1000:g}",
        },
    }
    role = kv_role(pool)
    if role == "prefill":
        return [queue, latency]
    if role == "decode":
        return [running]
    return [queue, running, latency]


def replica_counts(settings: Settings, pool: PoolSettings) -> dict[str, int]:
    """The floor: the stack's ``autoscaling.min_replicas``, or a disaggregated half's own
    ``replicas``; 0 where the node group goes to zero when idle. A half that goes to zero keeps its
    floor while it serves (KEDA's ``idleReplicaCount``: 0 while every trigger is inactive)."""
    auto = kubernetes_of(settings).autoscaling
    idle = idle_to_zero_s(pool) is not None
    if kv_role(pool) is None:
        return {"minReplicaCount": 0 if idle else auto.min_replicas}
    floor = pool.replicas or auto.min_replicas
    return {"idleReplicaCount": 0, "minReplicaCount": floor} if idle else {"minReplicaCount": floor}


def scale_target(pool: PoolSettings) -> dict[str, str]:
    """The pool's runtime workload: its Deployment, or its LeaderWorkerSet where a replica spans nodes."""
    if lw.replica_spans_nodes(pool):
        return {"apiVersion": lw.API_VERSION, "kind": lw.KIND, "name": lw.set_name(pool)}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "name": app_name(pool)}


def schedule_triggers(pool: PoolSettings) -> list[dict[str, object]]:
    """The serving group's schedule as KEDA cron triggers: inside each window at least its min_size
    replicas (one replica per node of the group; where a replica spans N nodes, enough replicas to
    hold min_size nodes), the queue-depth trigger scaling above it. KEDA takes the largest of its
    triggers, so a window only ever raises the floor."""
    schedule = pool.group.schedule
    if schedule is None:
        return []
    return [
        {
            "type": "cron",
            "name": f"schedule-{window.name}",
            "metadata": {
                "timezone": schedule.timezone,
                "start": cron_of(window, window.start),
                "end": cron_of(window, window.end),
                "desiredReplicas": str(math.ceil(window.min_size / pool.runtime.nodes_per_replica)),
            },
        }
        for window in schedule.windows
    ]


def idle_to_zero_s(pool: PoolSettings) -> int | None:
    """Seconds idle before the pool's runtime goes to zero replicas; None where it never does (its
    node group's min_size above 0)."""
    group = pool.group
    if group.min_size or group.idle_to_zero_s is None:
        return None
    return max(1, round(group.idle_to_zero_s))


def pool_waiting_query(settings: Settings, pool: PoolSettings) -> str:
    k = kubernetes_of(settings)
    return f'sum({POOL_WAITING_METRIC}{{namespace="{k.namespace}",{POOL_LABEL}="{pool.model.name}"}})'


def demand_triggers(settings: Settings, pool: PoolSettings) -> list[dict[str, object]]:
    """From zero: requests the gateway holds for the model (its hold queue) activate the
    ScaledObject — at zero the runtime's own queue does not exist to say so. Active above 0 held
    (``activationThreshold``), and counted like queued requests once replicas run."""
    if idle_to_zero_s(pool) is None:
        return []
    auto = kubernetes_of(settings).autoscaling
    return [
        {
            "type": "prometheus",
            "name": "held-by-gateway",
            "metricType": "AverageValue",
            "metadata": {
                "serverAddress": auto.prometheus_url,
                "query": pool_waiting_query(settings, pool),
                "threshold": str(auto.target_queue_depth),
                "activationThreshold": "0",
            },
        }
    ]
