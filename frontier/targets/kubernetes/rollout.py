"""Roll a release on Kubernetes: a canary Deployment first, then the Deployment itself, gated alike.

1. The release's ``runtime.yaml`` becomes an immutable ConfigMap named by its hash.
2. **Canary**: a second Deployment (``<app>-canary``, ``rollout.canary_hosts`` replicas) runs the
   new pod template next to the old pods, behind the same Service. When it is ready, the metric
   gate reads its pods' ``/metrics`` (through the API server's pod proxy) before and after
   ``rollout.gate.window_s`` and judges them with the host targets' gate (:mod:`frontier.rollout.gate`):
   with ``rollout.gate.max_p99_ratio``, against a pod still on the old release over the same window.
   With ``rollout.verify_canary`` the canary is verified before it takes any request: its pods
   carry the readiness gate ``frontier.dev/verified``, so once their containers are ready they are
   still out of the Service; the stack's verification set runs on each of them and on that old pod
   (over port-forward streams, :mod:`.portforward`, which reach a pod that is not Ready), judged
   as on the host targets (:mod:`frontier.rollout.canary`); only then does the rollout set the
   condition (``pods/status``), the pods turn Ready and the Service sends them requests, and the
   metric gate above runs on that traffic. The verification has the Deployment's progress deadline
   (``kubernetes.progress_deadline_s``) to finish in.
3. **Roll**: the stable Deployment's pod template is replaced (a JSON patch) and Kubernetes rolls
   it with the stack's maxSurge / maxUnavailable; the rollout's status is read until every replica
   is updated and available, or the Deployment reports ``ProgressDeadlineExceeded``.
4. The same gate over the new pods; then the canary is deleted.

Any failure — canary not ready, a gate verdict, a progress deadline, an API error — puts the
previous pod template back (the previous revision, as ``kubectl rollout undo`` would) and waits
for it to be available again, and deletes the canary. The result has the same shape as a host
rollout's, one entry per Deployment, so history records look alike on every target.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from frontier_hostside.names import K8S_RELEASE_ANNOTATION, K8S_VERIFIED_CONDITION
from kubernetes.client import ApiClient, AppsV1Api, CoreV1Api
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from frontier.config.schema import Kubernetes, PoolSettings, Settings
from frontier.errors import FrontierError
from frontier.release.release import Release
from frontier.rollout.canary import CanaryVerification, judge_verification
from frontier.rollout.gate import GateReading, judge, judge_relative, read_gate
from frontier.rollout.rolling import Event, HostResult, Reporter, RolloutResult
from frontier.targets.kubernetes import manifests as m
from frontier.targets.kubernetes.objects import TEMPLATE_HASH_ANNOTATION, Manifest
from frontier.targets.kubernetes.portforward import pod_tunnel
from frontier.verify import VerifyReport

CONFIG_FILE = m.CONFIG_FILE


# Every API call: the raw JSON (plain dicts, like the manifests), and never a hang on a dead server.
REQUEST_TIMEOUT_S = 30
CALL: dict[str, Any] = {"_preload_content": False, "_request_timeout": REQUEST_TIMEOUT_S}


class KubernetesRolloutError(FrontierError):
    """A step of a Kubernetes rollout that failed; the message says which and why."""


@dataclass
class Clock:
    """Time, injectable: tests run the same loops without waiting in real time."""

    sleep: Callable[[float], None] = time.sleep
    now: Callable[[], float] = time.monotonic


@dataclass
class _Step:
    result: HostResult
    report: Reporter

    def phase(self, name: str, fn: Callable[[], Any]) -> Any:
        self.report(Event(self.result.name, name, "start"))
        start = time.monotonic()
        try:
            value = fn()
        except Exception as exc:
            elapsed = time.monotonic() - start
            self.result.phases[name] = round(self.result.phases.get(name, 0.0) + elapsed, 3)
            self.report(Event(self.result.name, name, "fail", str(exc), elapsed))
            raise
        elapsed = time.monotonic() - start
        self.result.phases[name] = round(self.result.phases.get(name, 0.0) + elapsed, 3)
        self.report(Event(self.result.name, name, "ok", value if isinstance(value, str) else "", elapsed))
        return value


def _json(response: Any) -> dict[str, Any]:
    return json.loads(response.data)


def _condition(pod: dict[str, Any], kind: str) -> bool:
    """Whether ``pod``'s status condition ``kind`` is True."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)


def list_pods(api: ApiClient, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
    """Pods matching ``labels``, as the API server returns them (plain dicts)."""
    selector = ",".join(f"{k}={v}" for k, v in labels.items())
    listed = _json(CoreV1Api(api).list_namespaced_pod(namespace, label_selector=selector, **CALL))
    return list(listed.get("items", []))


@dataclass
class KubernetesRollout:
    """The rollout of ``pool``'s Deployment: a model pool's, or one half's of a disaggregated pool
    (:func:`frontier.targets.kubernetes.disaggregation.role_pools`)."""

    settings: Settings
    pool: PoolSettings
    api: ApiClient
    reporter: Reporter | None = None
    clock: Clock = field(default_factory=Clock)
    #: How often the rollout's status is read.
    poll_s: float = 2.0
    #: The canary's verification (``rollout.verify_canary`` on a deploy); None: none to run.
    verification: CanaryVerification | None = None

    def __post_init__(self) -> None:
        k = self.settings.section(Kubernetes)
        self.namespace = k.namespace
        self.name = m.app_name(self.pool)
        self.canary = m.canary_name(self.pool)
        self.apps, self.core = AppsV1Api(self.api), CoreV1Api(self.api)
        self.report: Reporter = self.reporter or (lambda event: None)
        health = self.settings.health
        self.excluded_routes = {health.readiness_path, health.liveness_path, "/metrics"}
        #: The pod template the last run replaced and kept (its release through the gate), which
        #: :meth:`undo` puts back; None while no run has.
        self.replaced: dict[str, Any] | None = None

    # --- reading and writing Deployments --------------------------------------------------------

    def deployment(self, name: str) -> dict[str, Any] | None:
        try:
            return _json(self.apps.read_namespaced_deployment(name, self.namespace, **CALL))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def current_release(self) -> str:
        live = self.deployment(self.name)
        if live is None:
            raise KubernetesRolloutError(
                f"deployment {self.namespace}/{self.name} does not exist: provision the stack first "
                f"(pulumi up -s {self.settings.stack}, or apply `fab render`'s manifests)"
            )
        annotations = live["spec"]["template"]["metadata"].get("annotations") or {}
        return str(annotations.get(K8S_RELEASE_ANNOTATION, ""))

    def _ensure_config(self, release: Release) -> str:
        manifest = m.config_map(self.settings, self.pool, release.files[CONFIG_FILE])
        try:
            self.core.create_namespaced_config_map(self.namespace, manifest.to_dict(), **CALL)
            return f"created {manifest.name}"
        except ApiException as exc:
            if exc.status != 409:  # immutable and named by content: one that exists is this one
                raise
            return f"{manifest.name} exists"

    def _same_shape(self, live: dict[str, Any], release: Release) -> bool:
        """The live pod template is the one this stack renders for ``release`` (by its hash)."""
        key = TEMPLATE_HASH_ANNOTATION
        running = (live["spec"]["template"]["metadata"].get("annotations") or {}).get(key)
        return running == self._template(release, "stable")["metadata"]["annotations"][key]

    def _template(self, release: Release, track: str) -> dict[str, Any]:
        return m.pod_template(
            self.settings,
            self.pool,
            release.digest,
            release.files[CONFIG_FILE],
            track=track,
            release_id=release.id,
        )

    def _replace_template(self, template: dict[str, Any]) -> None:
        patch = [{"op": "replace", "path": "/spec/template", "value": template}]
        self.apps.patch_namespaced_deployment(self.name, self.namespace, patch, **CALL)

    def prune_configs(self, in_use: str) -> str:
        """Delete the release ConfigMaps beyond ``rollout.keep_releases`` (newest kept; never ``in_use``).

        As many as the Deployment keeps revisions of, so a previous revision still finds its config.
        """
        selector = ",".join(f"{k}={v}" for k, v in m.selector(self.pool).items())
        listed = _json(self.core.list_namespaced_config_map(self.namespace, label_selector=selector, **CALL))
        newest_first = sorted(
            listed.get("items", []), key=lambda c: c["metadata"].get("creationTimestamp", ""), reverse=True
        )
        kept, deleted = {in_use}, []
        for item in newest_first:
            name = item["metadata"]["name"]
            if name in kept:
                continue
            if len(kept) < self.settings.rollout.keep_releases:
                kept.add(name)
                continue
            self.core.delete_namespaced_config_map(name, self.namespace, **CALL)
            deleted.append(name)
        return " ".join(deleted) or "nothing to prune"

    def _delete_canary(self) -> str:
        try:
            self.apps.delete_namespaced_deployment(self.canary, self.namespace, **CALL)
        except ApiException as exc:
            if exc.status != 404:
                raise
            return "none"
        return f"deleted {self.canary}"

    def wait_available(self, name: str, timeout_s: float) -> str:
        """Until every replica runs the current template and is available; fail on the progress deadline."""
        deadline = self.clock.now() + timeout_s
        while True:
            live = self.deployment(name)
            if live is None:
                raise KubernetesRolloutError(f"deployment {self.namespace}/{name} disappeared")
            status, spec = live.get("status") or {}, live["spec"]
            for condition in status.get("conditions") or []:
                if (
                    condition.get("type") == "Progressing"
                    and condition.get("reason") == "ProgressDeadlineExceeded"
                ):
                    raise KubernetesRolloutError(
                        f"deployment {name}: progress deadline exceeded ({spec.get('progressDeadlineSeconds')} s): "
                        f"{condition.get('message', '')}"
                    )
            want = spec.get("replicas", 1)
            observed = status.get("observedGeneration", 0) >= live["metadata"].get("generation", 0)
            updated, available = status.get("updatedReplicas", 0), status.get("availableReplicas", 0)
            total = status.get("replicas", 0)
            if observed and updated == want and available >= want and total == want:
                return f"{available}/{want} available"
            if self.clock.now() >= deadline:
                raise KubernetesRolloutError(
                    f"deployment {name}: {updated}/{want} updated, {available}/{want} available after {timeout_s:.0f} s"
                )
            self.clock.sleep(self.poll_s)

    # --- the gate ---------------------------------------------------------------------------------

    def _pods_of(self, track: str, release_id: str) -> list[dict[str, Any]]:
        """The live pods of ``track`` that run ``release_id``."""
        return [
            pod
            for pod in list_pods(self.api, self.namespace, m.selector(self.pool, track))
            if (pod["metadata"].get("annotations") or {}).get(K8S_RELEASE_ANNOTATION) == release_id
            and not pod["metadata"].get("deletionTimestamp")
        ]

    def pods(self, track: str, release_id: str) -> list[str]:
        return sorted(pod["metadata"]["name"] for pod in self._pods_of(track, release_id))

    def metrics(self, pod: str) -> str:
        response = self.core.connect_get_namespaced_pod_proxy_with_path(
            f"{pod}:{self.pool.runtime.port}", self.namespace, "metrics", **CALL
        )
        return response.data.decode()

    def old_pod(self, release_id: str) -> tuple[str, str] | None:
        """A serving pod not on ``release_id``, and the release it runs ("" for the image the stack
        was provisioned with, which no release names), if any."""
        for pod in list_pods(self.api, self.namespace, m.selector(self.pool, "stable")):
            meta = pod["metadata"]
            release = str((meta.get("annotations") or {}).get(K8S_RELEASE_ANNOTATION) or "")
            if release != release_id and not meta.get("deletionTimestamp"):
                return str(meta["name"]), release
        return None

    def gate(self, pods: list[str], old: str | None = None) -> str:
        """Each of ``pods`` over the window against the stack's limits, and, with
        ``rollout.gate.max_p99_ratio``, against ``old`` (a pod on the old release) over the same window."""
        gate = self.settings.rollout.gate
        if gate.window_s <= 0:
            return "skipped: rollout.gate.window_s is 0"
        if not pods:
            raise KubernetesRolloutError("no pod of the new release to gate")
        compare = old if gate.max_p99_ratio is not None else None
        watched = pods + ([compare] if compare is not None else [])
        before = {pod: self.metrics(pod) for pod in watched}
        self.clock.sleep(gate.window_s)
        old_reading: GateReading | None = None
        if compare is not None:
            old_reading = read_gate(before[compare], self.metrics(compare), self.excluded_routes)
        readings = []
        for pod in pods:
            reading = read_gate(before[pod], self.metrics(pod), self.excluded_routes)
            verdict = judge(reading, gate) or (
                judge_relative(reading, old_reading, gate) if old_reading is not None else None
            )
            if verdict:
                raise KubernetesRolloutError(f"gate on pod {pod}: {verdict}")
            readings.append(f"{pod}: {reading.describe()}")
        if old_reading is not None:
            readings.append(f"old release on {compare}: {old_reading.describe()}")
        return "; ".join(readings)

    # --- the canary's verification --------------------------------------------------------------

    def verify_old(self, old: tuple[str, str] | None) -> VerifyReport | None:
        """The verification set on ``old`` (a pod and the release it serves), the yardstick of the
        new pods; where nothing is recorded yet, that release's golden outputs are recorded first."""
        check = self.verification
        if check is None or old is None:
            return None
        pod, release = old
        with pod_tunnel(self.api, self.namespace, pod, check.runtime_port) as url:
            # Golden outputs belong beside a release: the provisioned image's are not recorded.
            if check.unrecorded and check.store is not None and release:
                check = self.verification = check.recorded_at(release, url)
                self.report(Event(pod, "verify", "info", f"golden outputs recorded from {release}"))
            report = check.run_at(url)
        self.report(
            Event(pod, "verify", "info", f"old release: {report.passed}/{len(report.results)} passed")
        )
        return report

    def verify(self, pods: list[str], old_report: VerifyReport | None) -> str:
        """The verification set on each of ``pods``, judged against ``old_report``."""
        check = self.verification
        if check is None:
            return "not asked (rollout.verify_canary)"
        if not pods:
            raise KubernetesRolloutError("no pod of the new release to verify")
        passed = []
        for pod in pods:
            with pod_tunnel(self.api, self.namespace, pod, check.runtime_port) as url:
                report = check.run_at(url)
            verdict = judge_verification(report, old_report, check)
            if verdict:
                raise KubernetesRolloutError(f"verify on pod {pod}: {verdict}")
            passed.append(
                f"{pod}: {report.passed}/{len(report.results)} cases passed ({report.pass_rate:.1%})"
            )
        return "; ".join(passed)

    def started(self, release_id: str, want: int, timeout_s: float) -> list[str]:
        """Once ``want`` of the canary's pods of ``release_id`` have every container ready: those of
        them their readiness gate still holds (not Ready, so the Deployment is not available yet),
        i.e. every one not admitted before."""
        deadline = self.clock.now() + timeout_s
        while True:
            up = [pod for pod in self._pods_of("canary", release_id) if _condition(pod, "ContainersReady")]
            if len(up) >= want:
                return sorted(p["metadata"]["name"] for p in up if not _condition(p, K8S_VERIFIED_CONDITION))
            if self.clock.now() >= deadline:
                raise KubernetesRolloutError(
                    f"deployment {self.canary}: {len(up)}/{want} pod(s) started after {timeout_s:.0f} s"
                )
            self.clock.sleep(self.poll_s)

    def admit(self, pods: list[str], timeout_s: float) -> str:
        """Each verified pod's gate condition set True (its status, as a controller sets one): the
        pods turn Ready, the Service sends them requests, and the canary Deployment is available."""
        condition = {
            "type": K8S_VERIFIED_CONDITION,
            "status": "True",
            "reason": "Verified",
            "message": "the stack's verification set passed on this pod",
            "lastTransitionTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        for pod in pods:
            # A JSON patch: the client library sends a patch body as one, and it appends the
            # condition without rewriting the kubelet's.
            patch = [{"op": "add", "path": "/status/conditions/-", "value": condition}]
            self.core.patch_namespaced_pod_status(pod, self.namespace, patch, **CALL)
        return f"{len(pods)} pod(s) admitted; {self.wait_available(self.canary, timeout_s)}"

    # --- the rollout ------------------------------------------------------------------------------

    def run(self, release: Release, kind: str = "deploy") -> RolloutResult:
        started = self.clock.now()
        result, canary, stable = self._results(release, kind)
        timeout = self.settings.rollout.readiness_timeout_s
        previous: dict[str, Any] | None = None
        try:
            live = self._check(release, canary, stable)
            if live is None:
                return result
            steps = _Step(stable, self.report)
            steps.phase("config", lambda: self._ensure_config(release))
            if self.settings.rollout.canary_hosts > 0:
                self._canary(release, _Step(canary, self.report), timeout)
            else:
                canary.outcome = "skipped"
            previous = live["spec"]["template"]
            steps.phase(
                "roll", lambda: self._replace_template(self._template(release, "stable")) or "patched"
            )
            steps.phase(
                "rollout",
                lambda: self.wait_available(self.name, self.settings.section(Kubernetes).progress_deadline_s),
            )
            steps.phase("gate", lambda: self.gate(self.pods("stable", release.id)))
            stable.outcome = "updated"
            self.replaced = previous
            _Step(canary, self.report).phase("cleanup", self._delete_canary)
            if canary.outcome == "pending":
                canary.outcome = "updated"  # it served the release through its gate, then made way
            # An old ConfigMap left behind is not worth failing a good rollout for.
            with contextlib.suppress(ApiException, HTTPError):
                in_use = m.config_map_name(self.pool, release.files[CONFIG_FILE])
                steps.phase("prune", lambda: self.prune_configs(in_use))
        except (Exception, KeyboardInterrupt) as exc:
            self._stopped(result, exc, canary, stable)
            result.outcome = "rolled_back" if self._restore(canary, stable, previous) else "failed"
        finally:
            result.duration_s = round(self.clock.now() - started, 3)
        return result

    def _results(self, release: Release, kind: str) -> tuple[RolloutResult, HostResult, HostResult]:
        """A run's result, with an entry for the canary Deployment and one for the stable one."""
        result = RolloutResult(kind=kind, release=release.id)
        canary = HostResult(f"deployment/{self.canary}", to_release=release.id)
        stable = HostResult(f"deployment/{self.name}", to_release=release.id)
        result.hosts = [canary, stable]
        return result, canary, stable

    def _check(self, release: Release, canary: HostResult, stable: HostResult) -> dict[str, Any] | None:
        """The live Deployment, the release it runs noted on both entries; None where it runs
        ``release`` already, in the shape this stack renders (both skipped once it is available)."""
        live = self.deployment(self.name)
        if live is None:
            self.current_release()  # raises, naming what to do
        assert live is not None
        stable.from_release = canary.from_release = self.current_release()
        if stable.from_release == release.id and self._same_shape(live, release):
            self.wait_available(self.name, self.settings.rollout.readiness_timeout_s)
            stable.outcome = canary.outcome = "skipped"
            self.report(Event(stable.name, "check", "info", f"already runs {release.id}"))
            return None
        return live

    def _stopped(
        self, result: RolloutResult, exc: BaseException, canary: HostResult, stable: HostResult
    ) -> None:
        """Why the run stopped, on ``result`` and on the Deployment whose phase failed (the stable
        one where no phase had begun)."""
        result.reason = self._reason(exc)
        failing = next((r for r in (canary, stable) if r.outcome == "pending" and r.phases), stable)
        failing.error = result.reason

    def _canary_deployment(self, release: Release, replicas: int) -> Manifest:
        return m.deployment(
            self.settings,
            self.pool,
            release.digest,
            release.files[CONFIG_FILE],
            track="canary",
            replicas=replicas,
            release_id=release.id,
            held_until_verified=self.verification is not None,
        )

    def _create_canary(self, manifest: Manifest) -> None:
        self._delete_canary()  # a canary left by an interrupted rollout is not this release's
        self.apps.create_namespaced_deployment(self.namespace, manifest.to_dict(), **CALL)

    def _canary(self, release: Release, step: _Step, timeout: float) -> None:
        manifest = self._canary_deployment(release, self.settings.rollout.canary_hosts)

        def create() -> str:
            self._create_canary(manifest)
            return f"{manifest.name}: {self.settings.rollout.canary_hosts} replica(s)"

        step.phase("canary", create)
        rollout = self.settings.rollout
        wants_old = self.verification is not None or rollout.gate.max_p99_ratio is not None
        old = self.old_pod(release.id) if wants_old else None
        if self.verification is None:
            step.phase("readiness", lambda: self.wait_available(self.canary, timeout))
            pods = self.pods("canary", release.id)
        else:  # verified before any request reaches it, then admitted to the Service
            pods = step.phase("readiness", lambda: self.started(release.id, rollout.canary_hosts, timeout))
            step.phase("verify", lambda: self.verify(pods, self.verify_old(old)))
            step.phase("admit", lambda: self.admit(pods, timeout))
        step.phase("gate", lambda: self.gate(pods, old[0] if old is not None else None))

    def undo(self, stable: HostResult) -> bool:
        """Put back the template the last run replaced, once its release had passed (a later step
        of a larger rollout failed): the same restore as a failed run's, recorded on ``stable``."""
        if self.replaced is None:
            return True
        canary = HostResult(f"deployment/{self.canary}", to_release=stable.to_release)
        return self._restore(canary, stable, self.replaced)

    def _restore(self, canary: HostResult, stable: HostResult, previous: dict[str, Any] | None) -> bool:
        """Delete the canary; put the previous pod template back if ours was applied. True when all is back."""
        back = True
        try:
            _Step(canary, self.report).phase("restore", self._delete_canary)
            canary.outcome = "restored" if canary.phases else "untouched"
        except Exception as exc:  # noqa: BLE001 - keep restoring the Deployment
            canary.outcome, canary.error, back = "failed", canary.error or str(exc), False
        if previous is None or "roll" not in stable.phases:
            stable.outcome = "untouched"
            return back
        step = _Step(stable, self.report)
        try:
            self.report(
                Event(
                    stable.name,
                    "restore",
                    "info",
                    f"back to {stable.from_release or 'the previous template'}",
                )
            )
            step.phase("restore", lambda: self._replace_template(previous) or "previous template")
            step.phase(
                "rollout",
                lambda: self.wait_available(self.name, self.settings.section(Kubernetes).progress_deadline_s),
            )
            stable.outcome = "restored"
        except Exception as exc:  # noqa: BLE001
            stable.outcome, stable.error, back = "failed", stable.error or str(exc), False
        return back

    @staticmethod
    def _reason(exc: BaseException) -> str:
        if isinstance(exc, KeyboardInterrupt):
            return "interrupted by the operator"
        if isinstance(exc, ApiException):
            body = exc.body.decode(errors="replace") if isinstance(exc.body, bytes) else str(exc.body or "")
            return f"Kubernetes API: {exc.status} {exc.reason}: {body[:200]}"
        if isinstance(exc, FrontierError):
            return str(exc)
        return f"{type(exc).__name__}: {exc}"
