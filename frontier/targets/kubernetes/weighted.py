"""Roll a release on Kubernetes by traffic share: the canary Deployment grows as the stable one shrinks.

With ``rollout.traffic_steps`` (e.g. ``[25, 50, 100]``) a pool's Deployment rolls in steps of its
traffic. Both Deployments carry the pool's labels, so the pool's Service selects the pods of both
and spreads requests over the ready ones: a step's share is carried by the replica ratio, the
canary's replicas over the pool's (:mod:`.shares`), and each step's realised share is reported
beside the asked one. The gateway, where one fronts the pool, reaches it by that same Service name
(:mod:`.gateway`), so it splits by the same ratio: it holds no per-replica list to weigh.

1. The release's ConfigMap, as for any rollout. The pool's ScaledObject is paused
   (``autoscaling.keda.sh/paused``: KEDA leaves the Deployment's replicas alone until it is
   removed), so the counts below are the rollout's alone, and the stable Deployment is raised to the
   pool's count (``replicas``, else its node group's desired_size, or what it runs if more).
2. **Steps**: for each share, the canary (``<app>-canary``, the new pod template) is raised to the
   step's count and, once its pods are available, the stable Deployment lowered by as many, at most
   ``rollout.max_surge + rollout.canary_hosts`` pods at a time (the room the node pool keeps for a
   rollout, :mod:`.rules`): weights go up before any go down. After each step the Service's ready
   endpoints (its EndpointSlices) are counted: fewer than one stops the rollout. The step holds
   ``rollout.gate.window_s`` (window after window until the new release served ``gate.min_requests``)
   and is gated on each release's own series, its pods' ``/metrics`` summed: the new release's
   errors and p99 against the stack's limits and, with ``gate.max_p99_ratio``, against the old
   release's over the same window. With ``rollout.verify_canary`` the canary's pods are held out
   of the Service by their readiness gate (:mod:`.rollout`): at the first step the verification
   set runs on them before they are admitted, so no request reaches an unverified pod; a later
   step's new canary pods, of a release already verified, are admitted as they start.
3. At 100 % the stable Deployment, at 0 replicas, takes the new template and the pods move back to
   it the same way (stable up, canary down); the canary is deleted and the ScaledObject resumed.

Any failure reverts, weights up before any go down: the stable Deployment (its previous template
put back where it had been replaced) is raised to the pool's count, the canary lowered as the
stable rises and then deleted, and the ScaledObject resumed. The stable Deployment never has fewer
pods during a revert than when it began.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from functools import partial
from typing import Any, Final

from kubernetes.client import CustomObjectsApi, DiscoveryV1Api
from kubernetes.client.exceptions import ApiException

from frontier.errors import FrontierError
from frontier.release.release import Release
from frontier.rollout.rolling import Event, HostResult, RolloutResult, TrafficStep
from frontier.rollout.weighted import ROUTABLE_FLOOR, RoutableLost, StepGate
from frontier.targets.kubernetes import manifests as m
from frontier.targets.kubernetes import shares
from frontier.targets.kubernetes.rollout import (
    CALL,
    CONFIG_FILE,
    KubernetesRollout,
    KubernetesRolloutError,
    _json,
    _Step,
    list_pods,
)

#: KEDA (2.13 and later) stops scaling a ScaledObject's target while this annotation is "true".
KEDA_PAUSED: Final = "autoscaling.keda.sh/paused"
KEDA_GROUP, KEDA_VERSION, KEDA_PLURAL = "keda.sh", "v1alpha1", "scaledobjects"
#: The label the EndpointSlice controller puts on a Service's slices.
SERVICE_NAME_LABEL: Final = "kubernetes.io/service-name"


def describe(steps: tuple[int, ...], total: int) -> str:
    realised = " -> ".join(
        f"{p} % ({shares.share(shares.canary_replicas(p, total), total):.0f} % realised)" for p in steps
    )
    return f"weighted by replicas: {realised} of {total} replicas (rollout.traffic_steps)"


@dataclass
class _Split:
    """Where the pods are: the stable Deployment's and the canary's replicas, and what was changed."""

    total: int
    stable: int
    canary: int = 0
    #: The stable Deployment's pod template before this rollout replaced it (None: not replaced).
    previous: dict[str, Any] | None = None
    paused: bool = False
    canary_made: bool = False
    #: With ``rollout.verify_canary``: the canary's result (where its verification is recorded) and
    #: whether the new release passed it. Which pods are admitted, their own status says.
    verifying: HostResult | None = None
    verified: bool = False


@dataclass
class WeightedKubernetesRollout(KubernetesRollout):
    """A pool's Deployment rolled by traffic share."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.custom = CustomObjectsApi(self.api)
        self.discovery = DiscoveryV1Api(self.api)
        rollout = self.settings.rollout
        #: Pods one move may add before it removes as many: the room the node pool keeps for a rollout.
        self.room = max(1, rollout.max_surge + rollout.canary_hosts)

    # --- the rollout ------------------------------------------------------------------------------

    def run(self, release: Release, kind: str = "deploy") -> RolloutResult:
        started = self.clock.now()
        result, canary, stable = self._results(release, kind)
        split: _Split | None = None
        try:
            live = self._check(release, canary, stable)
            if live is None:
                return result
            running = int(live["spec"].get("replicas", 1))
            split = _Split(total=max(running, shares.rollout_replicas(self.pool)), stable=running)
            self._refuse_what_cannot_split(split.total)
            result.strategy = describe(self.settings.rollout.traffic_steps, split.total)
            phase = _Step(stable, self.report).phase
            phase("config", lambda: self._ensure_config(release))
            phase("pause", lambda: self._pause(split))
            phase("scale", lambda: self._scale(self.name, split, split.total))
            _Step(canary, self.report).phase("canary", lambda: self._add_canary(release, split))
            split.verifying = canary
            self._steps(release, result, split, canary)
            self._finish(release, split, stable, canary)
            stable.outcome = canary.outcome = "updated"
            with contextlib.suppress(Exception):  # an old ConfigMap left behind fails no good rollout
                in_use = m.config_map_name(self.pool, release.files[CONFIG_FILE])
                phase("prune", lambda: self.prune_configs(in_use))
        except (Exception, KeyboardInterrupt) as exc:
            self._stopped(result, exc, canary, stable)
            result.outcome = "rolled_back" if self._revert(split, stable, canary) else "failed"
        finally:
            result.duration_s = round(self.clock.now() - started, 3)
        return result

    def _refuse_what_cannot_split(self, total: int) -> None:
        """Before anything changes: every step a distinct share of ``total`` replicas (the stack's
        count was checked at load; a pool the autoscaler raised above it is checked here)."""
        problems = shares.unrealisable(self.settings.rollout.traffic_steps, total)
        if problems:
            raise KubernetesRolloutError(
                f"rollout.traffic_steps on {total} replicas: " + "; ".join(p.describe() for p in problems)
            )

    def _add_canary(self, release: Release, split: _Split) -> str:
        manifest = self._canary_deployment(release, replicas=0)
        self._create_canary(manifest)
        split.canary_made = True
        return f"{manifest.name}: 0 replicas, no traffic yet"

    def _steps(self, release: Release, result: RolloutResult, split: _Split, canary: HostResult) -> None:
        for percent in self.settings.rollout.traffic_steps:
            count = shares.canary_replicas(percent, split.total)
            step = TrafficStep(percent, realised=shares.share(count, split.total))
            result.steps.append(step)
            label = f"{percent}%"
            self.report(
                Event(
                    label,
                    "step",
                    "start",
                    f"{percent} % asked: {count} of {split.total} replicas on the new release "
                    f"({step.realised:.0f} % realised)",
                )
            )
            self._shift(split, count, release.id)
            step.routable = self._invariant(f"{percent} % of traffic on the new release")
            self._hold_and_gate(step, release)

    def _finish(self, release: Release, split: _Split, stable: HostResult, canary: HostResult) -> None:
        """Every pod on the canary: the stable Deployment takes the new template at 0 replicas and
        the pods move back to it, then the canary goes and the autoscaler resumes."""
        live = self.deployment(self.name)
        assert live is not None
        split.previous = live["spec"]["template"]
        _Step(stable, self.report).phase(
            "roll", lambda: self._replace_template(self._template(release, "stable")) or "patched"
        )
        _Step(stable, self.report).phase("scale", lambda: self._shift(split, 0) or "every pod on the stable")
        self.replaced = split.previous
        _Step(canary, self.report).phase("cleanup", lambda: self._remove_canary(split))
        _Step(stable, self.report).phase("resume", lambda: self._resume(split))

    # --- moving pods between the two Deployments --------------------------------------------------

    def _scale(self, name: str, split: _Split, replicas: int, release_id: str = "") -> str:
        """``name`` to ``replicas``; a Deployment that rises is waited for until its pods are
        available, one that falls is not (its pods leave the Service's endpoints as they terminate)."""
        current = split.stable if name == self.name else split.canary
        if replicas == current:
            return f"{replicas} replicas"
        patch = [{"op": "replace", "path": "/spec/replicas", "value": replicas}]
        self.apps.patch_namespaced_deployment(name, self.namespace, patch, **CALL)
        if name == self.name:
            split.stable = replicas
        else:
            split.canary = replicas
        self.report(Event(f"deployment/{name}", "scale", "info", f"{current} -> {replicas} replicas"))
        if replicas < current:
            return f"{replicas} replicas"
        if name == self.canary and self.verification is not None:
            return self._admit_canary(split, release_id)
        return self.wait_available(name, self.settings.rollout.readiness_timeout_s)

    def _admit_canary(self, split: _Split, release_id: str) -> str:
        """The canary's new pods, held by their readiness gate, admitted once started: at the first
        step after the verification set passed on them against a pod of the old release."""
        timeout = self.settings.rollout.readiness_timeout_s
        new = self.started(release_id, split.canary, timeout)
        if not split.verified:
            assert split.verifying is not None  # set as the canary is made, before any step
            verify = partial(self.verify, new, self.verify_old(self.old_pod(release_id)))
            _Step(split.verifying, self.report).phase("verify", verify)
            split.verified = True
        return self.admit(new, timeout)

    def _shift(self, split: _Split, canary: int, release_id: str = "") -> None:
        """The canary to ``canary`` replicas and the stable to the rest of the pool's, ``room`` pods
        at a time, the rising Deployment's new pods available before the other loses as many."""
        stable = split.total - canary
        while (split.canary, split.stable) != (canary, stable):
            if split.canary < canary:
                self._scale(
                    self.canary, split, split.canary + min(self.room, canary - split.canary), release_id
                )
                self._scale(self.name, split, max(stable, split.total - split.canary))
            else:
                if split.stable < stable:
                    self._scale(self.name, split, split.stable + min(self.room, stable - split.stable))
                self._scale(self.canary, split, max(canary, split.total - split.stable))

    def _remove_canary(self, split: _Split) -> str:
        if split.canary:
            raise KubernetesRolloutError(f"canary still runs {split.canary} replica(s): not removed")
        done = self._delete_canary()
        split.canary_made = False
        return done

    def _pause(self, split: _Split) -> str:
        self._annotate_scaler({KEDA_PAUSED: "true"})
        split.paused = True
        return f"scaledobject {self.name} paused"

    def _resume(self, split: _Split) -> str:
        self._annotate_scaler({KEDA_PAUSED: None})
        split.paused = False
        return f"scaledobject {self.name} resumed"

    def _annotate_scaler(self, annotations: dict[str, str | None]) -> None:
        # A merge patch: null removes the annotation, leaving the ScaledObject's others alone.
        self.custom.patch_namespaced_custom_object(
            KEDA_GROUP,
            KEDA_VERSION,
            self.namespace,
            KEDA_PLURAL,
            self.name,
            {"metadata": {"annotations": annotations}},
            **CALL,
        )

    # --- the invariant and the gate ---------------------------------------------------------------

    def ready_endpoints(self) -> list[str]:
        """The pods the pool's Service sends requests to now: its EndpointSlices' ready endpoints."""
        listed = _json(
            self.discovery.list_namespaced_endpoint_slice(
                self.namespace, label_selector=f"{SERVICE_NAME_LABEL}={self.name}", **CALL
            )
        )
        ready = set()
        for slice_ in listed.get("items", []):
            for endpoint in slice_.get("endpoints") or []:
                if (endpoint.get("conditions") or {}).get("ready") is False:
                    continue
                ref = endpoint.get("targetRef") or {}
                ready.add(str(ref.get("name") or ",".join(endpoint.get("addresses") or [])))
        return sorted(ready)

    def _invariant(self, after: str) -> int:
        names = self.ready_endpoints()
        detail = f"{len(names)} ready endpoint(s) of service {self.name} after {after}"
        self.report(Event("-", "routable", "ok" if len(names) >= ROUTABLE_FLOOR else "fail", detail))
        if len(names) < ROUTABLE_FLOOR:
            raise RoutableLost(f"{detail}: a rollout keeps at least {ROUTABLE_FLOOR} replica routable")
        return len(names)

    def _old_pods(self) -> list[str]:
        """The stable Deployment's live pods: the old release's, while the steps run."""
        listed = list_pods(self.api, self.namespace, m.selector(self.pool, "stable"))
        return sorted(p["metadata"]["name"] for p in listed if not p["metadata"].get("deletionTimestamp"))

    def _scrape(self, pods: list[str]) -> dict[str, str]:
        return {pod: self.metrics(pod) for pod in pods}

    def _hold_and_gate(self, step: TrafficStep, release: Release) -> None:
        gate = StepGate(
            self.settings.rollout.gate, self._scrape, self.excluded_routes, self.report, self.clock.sleep
        )
        verdict = gate.hold(step, lambda: (self.pods("canary", release.id), self._old_pods()))
        if verdict:
            raise KubernetesRolloutError(f"traffic step {step.percent} %: {verdict}")

    # --- the revert -------------------------------------------------------------------------------

    def _revert(self, split: _Split | None, stable: HostResult, canary: HostResult) -> bool:
        """The stable Deployment back on its template and raised to the pool's count before the
        canary loses a pod, then the canary deleted and the autoscaler resumed; True when all is back."""
        if split is None or not (split.paused or split.canary_made or split.previous):
            stable.outcome = canary.outcome = "untouched"
            return True
        back = True
        try:
            if split.previous is not None:
                previous = split.previous
                _Step(stable, self.report).phase(
                    "restore", lambda: self._replace_template(previous) or "previous template"
                )
                _Step(stable, self.report).phase(
                    "rollout",
                    lambda: self.wait_available(self.name, self.settings.rollout.readiness_timeout_s),
                )
            _Step(stable, self.report).phase(
                "restore", lambda: self._shift(split, 0) or f"{split.total} replicas"
            )
            self._reverted("the stable deployment restored")
            stable.outcome = "restored"
        except Exception as exc:  # noqa: BLE001 - the canary keeps serving what the stable cannot
            stable.outcome, stable.error, back = "failed", stable.error or str(exc), False
        if back and split.canary_made:
            try:
                _Step(canary, self.report).phase("restore", lambda: self._remove_canary(split))
                self._reverted("the canary removed")
                canary.outcome = "restored"
            except Exception as exc:  # noqa: BLE001
                canary.outcome, canary.error, back = "failed", canary.error or str(exc), False
        elif back:
            canary.outcome = "untouched"
        if split.paused:
            try:
                _Step(stable, self.report).phase("resume", lambda: self._resume(split))
            except Exception as exc:  # noqa: BLE001
                stable.error, back = stable.error or str(exc), False
        return back

    def _reverted(self, after: str) -> None:
        """The invariant during a revert is reported; a revert goes on whatever it finds."""
        with contextlib.suppress(RoutableLost, ApiException, FrontierError):
            self._invariant(after)
