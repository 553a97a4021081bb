"""The demo's scale-from-zero part: a pool at zero hosts receives requests and loses none.

One pool of the running demo stack goes to zero (its slot retired, drained). Then N requests for
its model arrive at the gateway at once: the gateway holds them (its hold queue, ``gateway.hold``),
the local autoscaler sees the held requests on the gateway's admin ``/metrics`` and launches one
slot at once, the slot boots the current release from the history, the gateway's prober finds it
ready and releases the queue. Every request is answered; the first one's time to first token is
the cold start a client waits through. With nothing more to do, the pool goes back to zero after
its ``idle_to_zero_s``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from frontier_hostside.names import METRICS_PATH, READINESS_PATH

from frontier.config.schema import Settings
from frontier.demo.variants import load_variant, stack_document
from frontier.errors import FrontierError
from frontier.hosts.balancer import Balancer
from frontier.hosts.inventory import HostSpec
from frontier.loadtest.client import Target, stream_request
from frontier.loadtest.stats import RequestSample
from frontier.targets import backend_for
from frontier.targets.local import cluster
from frontier.targets.local.autoscaler import Autoscaler, Decision
from frontier.targets.local.group import LocalFleet

# Back to zero soon after the demo's requests; a cold start on a busy two-core machine takes about
# 45 s, so requests are held up to a launch's whole readiness budget (rollout.readiness_timeout_s).
IDLE_TO_ZERO_S = 5.0
MAX_HELD = 64


@dataclass
class ZeroRun:
    """What one scale-from-zero round showed."""

    model: str
    samples: list[RequestSample]
    to_zero_s: float  # taking the pool to zero at the start
    back_to_zero_s: float  # from the last answer to the pool at zero again
    decisions: list[str] = field(default_factory=list)
    launch_s: float | None = None  # the slot's launch: boot from the history, ready, in rotation

    @property
    def failed(self) -> int:
        return sum(not s.ok for s in self.samples)

    @property
    def first_ttft_s(self) -> float | None:
        """Time to first token of the request sent first: the whole cold start, held."""
        return self.samples[0].ttft_s if self.samples else None


def zero_settings(settings: Settings) -> Settings:
    """The stack file with its serving node group allowed to reach zero: ``min_size: 0``, an idle
    time, and a hold queue in the gateway for every model (the rule for ``min_size: 0``)."""
    document = stack_document(settings)
    config = document["config"]
    group = config["frontier:node_groups"][0]
    group["min_size"] = 0
    group["idle_to_zero_s"] = IDLE_TO_ZERO_S
    gateway = config.get("frontier:gateway")
    if gateway is None:
        raise FrontierError(
            f"{settings.source}: scale from zero needs a 'frontier:gateway' section to hold requests"
        )
    hold_s = settings.rollout.readiness_timeout_s
    gateway["hold"] = {pool.name: {"max_requests": MAX_HELD, "timeout_s": hold_s} for pool in settings.pools}
    # Nothing is sent while a request is held: the balancer's idle timeout must outlast the hold.
    edge = config["frontier:edge"]
    edge["idle_timeout_s"] = max(int(edge.get("idle_timeout_s", 0)), int(hold_s) + 30)
    return load_variant(
        settings,
        document,
        Path(settings.source).with_name(f"zero-{Path(settings.source).name}"),
        "The stack with its node group allowed to reach zero, requests held by the gateway meanwhile.",
    )


class GatewayRouted:
    """The balancer of a pool only the gateway routes to (no HAProxy backend): a slot is in rotation
    once the gateway's prober finds it ready; a retired slot needs no drain here, since the runtime
    drains what it holds when the host agent stops it and the prober takes it out."""

    def __init__(self, admin_url: str, model: str) -> None:
        self.admin_url = admin_url
        self.model = model

    def enable(self, host: HostSpec, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.state(host) == "ready":
                return
            time.sleep(0.2)
        raise FrontierError(
            f"{host.name}: the gateway found no ready replica of {self.model!r} in {timeout:g}s"
        )

    def drain(self, host: HostSpec, timeout: float) -> int | None:
        return None

    def state(self, host: HostSpec) -> str:
        try:
            detail = httpx.get(self.admin_url + READINESS_PATH, timeout=2).json()
        except (httpx.HTTPError, ValueError):
            return "unknown"
        ready = detail.get("models", {}).get(self.model, {}).get("ready", 0)
        return "ready" if ready else "down"


def pool_fleet(settings: Settings, model: str, balancer: Balancer | None = None) -> LocalFleet:
    """The fleet of one pool's slots (``balancer``: who puts a launched slot in rotation; default
    the stack's HAProxy)."""
    pool_settings = settings.for_pool(model)
    backend = backend_for(pool_settings)
    if balancer is None:
        return backend.fleet()
    return LocalFleet(
        pool_settings,
        backend.pool,
        backend.history_store,
        balancer,
        backend.connect,
        state_dir=cluster.state_dir(settings),
    )


def held_requests(url: str, key: str, model: str, count: int, timeout_s: float) -> list[RequestSample]:
    """``count`` streamed chats sent at once through the gateway, in the order they were sent."""
    target = Target(
        url, model, api_key=key, endpoint="chat", prompt_tokens=16, max_tokens=16, timeout_s=timeout_s
    )

    async def run() -> list[RequestSample]:
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            return list(
                await asyncio.gather(
                    *(stream_request(client, target, f"cold question {i}") for i in range(count))
                )
            )

    return asyncio.run(run())


def scale_from_zero(
    settings: Settings,
    model: str,
    *,
    gateway_url: str,
    key: str,
    requests: int = 8,
    balancer: Balancer | None = None,
    say: Callable[[str], None] = print,
) -> ZeroRun:
    """Take ``model``'s pool to zero, send ``requests`` at once through the gateway while the local
    autoscaler brings one slot up, then wait for the pool to go back to zero by itself."""
    gateway = settings.gateway
    group = settings.pool(model).group
    if gateway is None or model not in gateway.hold or group.min_size != 0 or group.idle_to_zero_s is None:
        raise FrontierError(
            f"model {model!r} of stack {settings.stack!r} cannot go to zero: it needs min_size 0, "
            f"idle_to_zero_s and gateway.hold.{model} (see zero_settings)"
        )
    admin_url = f"http://{gateway.admin_host}:{gateway.admin_port}"
    fleet = pool_fleet(settings, model, balancer)
    started = time.perf_counter()
    if fleet.size().desired:
        say(f"{model}: retiring {fleet.size().desired} slot(s) to reach zero")
        fleet.scale(0)
    to_zero_s = time.perf_counter() - started
    decisions: list[str] = []
    went_back = threading.Event()

    def decided(decision: Decision, outcome: str) -> None:
        decisions.append(f"{decision.current} → {decision.desired}: {decision.reason} ({outcome})")
        say(f"autoscaler: {decisions[-1]}")
        if decision.desired == 0:
            went_back.set()

    autoscaler = Autoscaler(
        settings.for_pool(model), fleet, on_decision=decided, gateway_metrics_url=admin_url + METRICS_PATH
    ).start()
    try:
        say(f"{model}: at zero; {requests} requests at once through the gateway")
        timeout_s = gateway.hold[model].timeout_s + settings.rollout.readiness_timeout_s
        samples = held_requests(gateway_url, key, model, requests, timeout_s)
        answered = time.perf_counter()
        # The idle time, then the cooldown after the launch and a retire (drain, then the runtime's stop).
        timing = cluster.require_local(settings, "scale from zero runs on the local stack").autoscaler
        slack = timing.cooldown_s + 10 * timing.interval_s + settings.rollout.deregistration_delay_s + 60
        deadline = answered + group.idle_to_zero_s + slack
        # The launch may still be recording itself when the answers are in: wait for the decision back.
        went_back.wait(max(0.0, deadline - time.perf_counter()))
        back_to_zero_s = time.perf_counter() - answered
    finally:
        autoscaler.stop()
    if fleet.size().desired:
        raise FrontierError(
            f"{model}: still {fleet.size().desired} slot(s) in service {back_to_zero_s:.0f}s after the last answer"
        )
    launches = [a for a in fleet.activities() if a.action == "launch" and a.outcome == "in_service"]
    return ZeroRun(
        model, samples, to_zero_s, back_to_zero_s, decisions, launches[-1].seconds if launches else None
    )


def demo_part(multi: Settings, model: str, key: str, say: Callable[[str], None] = print) -> ZeroRun:
    """The demo's step on its two-model stack: the gateway again with hold queues, ``model``'s pool
    (routed by the gateway only) to zero and back on demand, then its slots restored so the next
    run of the demo finds the stack as it was."""
    from frontier.targets.local import gateway as local_gateway

    zeroed = zero_settings(multi)
    for component in local_gateway.start(zeroed):
        say(f"{component.name:<16} {component.state:<8} {component.detail}")
    assert zeroed.gateway is not None
    admin_url = f"http://{zeroed.gateway.admin_host}:{zeroed.gateway.admin_port}"
    balancer = GatewayRouted(admin_url, model)
    before = pool_fleet(zeroed, model, balancer).size().desired
    try:
        run = scale_from_zero(
            zeroed,
            model,
            gateway_url=local_gateway.gateway_url(zeroed),
            key=key,
            balancer=balancer,
            say=say,
        )
    finally:
        fleet = pool_fleet(zeroed, model, balancer)
        if fleet.size().desired < before:
            fleet.scale(before)
    ttft = "n/a" if run.first_ttft_s is None else f"{run.first_ttft_s:.1f}s"
    launch = "n/a" if run.launch_s is None else f"{run.launch_s:.1f}s"
    say(
        f"{model} from zero: {len(run.samples)} requests held and answered, {run.failed} failed; "
        f"time to first token of the first request {ttft} (slot launch {launch}); "
        f"back to zero {run.back_to_zero_s:.1f}s after the last answer"
    )
    return run
