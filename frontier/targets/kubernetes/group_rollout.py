"""Roll a release on a pool whose replica spans nodes: its LeaderWorkerSet, gated like a Deployment.

1. The release's ``runtime.yaml`` becomes the same immutable ConfigMap a Deployment's would.
2. **Roll**: both pod templates of the LeaderWorkerSet (leader and workers) are replaced in one
   JSON patch; the LWS controller rolls group by group with the rollout strategy the stack renders
   (surging whole groups, none of the serving ones out, where the node group has room). Its status is
   read until every group is updated and ready and no surge group is left, within
   ``kubernetes.progress_deadline_s`` (LWS has no progress deadline of its own).
3. **Gate**: the metric gate over the new leaders' ``/metrics`` (the leaders serve; workers have
   no HTTP), as for a Deployment.

There is no canary group: a canary of a replica over N nodes holds N nodes beside the surge, and
with maxUnavailable 0 the first new group must already be whole and ready (every node joined, the
model loaded on all of them) before any old group goes. Any failure — a roll that does not
finish in time, a gate verdict, an API error — puts both previous templates back and waits for
the groups to be ready again. The result has one entry, ``leaderworkerset/<name>``.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from frontier_hostside.names import K8S_RELEASE_ANNOTATION
from kubernetes.client import CustomObjectsApi
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from frontier.release.release import Release
from frontier.rollout.rolling import Event, HostResult, RolloutResult
from frontier.targets.kubernetes import leader_workers as lw
from frontier.targets.kubernetes import manifests as m
from frontier.targets.kubernetes.objects import TEMPLATE_HASH_ANNOTATION, kubernetes_of
from frontier.targets.kubernetes.rollout import (
    CALL,
    CONFIG_FILE,
    KubernetesRollout,
    KubernetesRolloutError,
    _Step,
    list_pods,
)

GROUP, VERSION = lw.API_VERSION.split("/")
PLURAL = lw.PLURAL
TEMPLATES = ("leaderTemplate", "workerTemplate")


class LeaderWorkerSetRollout(KubernetesRollout):
    """A :class:`KubernetesRollout` whose target is the pool's LeaderWorkerSet (same gate, config
    and pruning; no canary: ``rollout.gate.max_p99_ratio`` is refused at load for such a pool, and
    the verification set runs on an old leader before the roll and on the new leaders after it)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.name = lw.set_name(self.pool)
        self.custom = CustomObjectsApi(self.api)

    # --- reading and writing the LeaderWorkerSet --------------------------------------------------

    def group(self) -> dict[str, Any] | None:
        try:
            response = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, self.name, **CALL
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return dict(json.loads(response.data))

    def _live(self) -> dict[str, Any]:
        live = self.group()
        if live is None:
            raise KubernetesRolloutError(
                f"leaderworkerset {self.namespace}/{self.name} does not exist: provision the stack first "
                f"(pulumi up -s {self.settings.stack}, or apply `fab render`'s manifests)"
            )
        return live

    def current_release(self) -> str:
        leader = self._live()["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
        return str((leader["metadata"].get("annotations") or {}).get(K8S_RELEASE_ANNOTATION, ""))

    def _templates(self, release: Release) -> dict[str, dict[str, Any]]:
        pod = m.pod_template(
            self.settings,
            self.pool,
            release.digest,
            release.files[CONFIG_FILE],
            track="stable",
            release_id=release.id,
        )
        spec = lw.leader_worker_set(self.settings, self.pool, pod).body["spec"]["leaderWorkerTemplate"]
        return {which: spec[which] for which in TEMPLATES}

    def _same_shape(self, live: dict[str, Any], release: Release) -> bool:
        """Both live templates are the ones this stack renders for ``release`` (by their hashes)."""
        rendered, running = self._templates(release), live["spec"]["leaderWorkerTemplate"]

        def shape(template: dict[str, Any]) -> str | None:
            return (template["metadata"].get("annotations") or {}).get(TEMPLATE_HASH_ANNOTATION)

        return all(shape(running[which]) == shape(rendered[which]) for which in TEMPLATES)

    def _replace_templates(self, templates: dict[str, dict[str, Any]]) -> None:
        # A JSON patch: a merge patch would keep fields the previous templates had and these lack.
        patch = [
            {"op": "replace", "path": f"/spec/leaderWorkerTemplate/{which}", "value": templates[which]}
            for which in TEMPLATES
        ]
        self.api.call_api(
            f"/apis/{GROUP}/{VERSION}/namespaces/{self.namespace}/{PLURAL}/{self.name}",
            "PATCH",
            header_params={"Content-Type": "application/json-patch+json", "Accept": "application/json"},
            body=patch,
            auth_settings=["BearerToken"],
            **CALL,
        )

    def wait_ready(self, timeout_s: float) -> str:
        """Until every group runs the current templates and is ready, and no surge group is left."""
        deadline = self.clock.now() + timeout_s
        while True:
            live = self._live()
            status, spec = live.get("status") or {}, live["spec"]
            want = spec.get("replicas", 1)
            observed = status.get("observedGeneration", 0) >= live["metadata"].get("generation", 0)
            updated, ready = status.get("updatedReplicas", 0), status.get("readyReplicas", 0)
            total = status.get("replicas", 0)
            rolling = any(
                c.get("type") == "UpdateInProgress" and c.get("status") == "True"
                for c in status.get("conditions") or []
            )
            if observed and not rolling and updated == want and ready >= want and total == want:
                return f"{ready}/{want} groups ready"
            if self.clock.now() >= deadline:
                raise KubernetesRolloutError(
                    f"leaderworkerset {self.name}: {updated}/{want} groups updated, {ready}/{want} ready "
                    f"after {timeout_s:.0f} s (kubernetes.progress_deadline_s)"
                )
            self.clock.sleep(self.poll_s)

    def pods(self, track: str, release_id: str) -> list[str]:
        """The release's leader pods: the gate reads the pods that serve."""
        names = []
        for pod in list_pods(self.api, self.namespace, lw.leader_selector(self.pool)):
            meta = pod["metadata"]
            if (meta.get("annotations") or {}).get(K8S_RELEASE_ANNOTATION) == release_id and not meta.get(
                "deletionTimestamp"
            ):
                names.append(meta["name"])
        return sorted(names)

    # --- the rollout ------------------------------------------------------------------------------

    def run(self, release: Release, kind: str = "deploy") -> RolloutResult:
        started = self.clock.now()
        result = RolloutResult(kind=kind, release=release.id)
        group = HostResult(f"leaderworkerset/{self.name}", to_release=release.id)
        result.hosts = [group]
        deadline = kubernetes_of(self.settings).progress_deadline_s
        previous: dict[str, dict[str, Any]] | None = None
        try:
            live = self._live()
            group.from_release = self.current_release()
            if group.from_release == release.id and self._same_shape(live, release):
                self.wait_ready(deadline)
                group.outcome = "skipped"
                self.report(Event(group.name, "check", "info", f"already runs {release.id}"))
                return result
            steps = _Step(group, self.report)
            steps.phase("config", lambda: self._ensure_config(release))
            # No canary serves beside the old groups: the old release is verified before the roll,
            # the new one after it, and a verdict against the new one puts the old templates back.
            old_leaders = self.pods("stable", group.from_release) if self.verification else []
            old = (old_leaders[0], group.from_release) if old_leaders and group.from_release else None
            old_report = steps.phase("verify", lambda: self.verify_old(old)) if self.verification else None
            previous = {which: live["spec"]["leaderWorkerTemplate"][which] for which in TEMPLATES}
            steps.phase("roll", lambda: self._replace_templates(self._templates(release)) or "patched")
            steps.phase("rollout", lambda: self.wait_ready(deadline))
            steps.phase("gate", lambda: self.gate(self.pods("stable", release.id)))
            if self.verification is not None:
                steps.phase("verify", lambda: self.verify(self.pods("stable", release.id), old_report))
            group.outcome = "updated"
            # An old ConfigMap left behind is not worth failing a good rollout for.
            with contextlib.suppress(ApiException, HTTPError):
                in_use = m.config_map_name(self.pool, release.files[CONFIG_FILE])
                steps.phase("prune", lambda: self.prune_configs(in_use))
        except (Exception, KeyboardInterrupt) as exc:
            result.reason = self._reason(exc)
            group.error = result.reason
            result.outcome = "rolled_back" if self._restore_group(group, previous, deadline) else "failed"
        finally:
            result.duration_s = round(self.clock.now() - started, 3)
        return result

    def _restore_group(
        self, group: HostResult, previous: dict[str, dict[str, Any]] | None, deadline: float
    ) -> bool:
        """Both previous templates back, if ours were applied. True when all is back."""
        if previous is None or "roll" not in group.phases:
            group.outcome = "untouched"
            return True
        step = _Step(group, self.report)
        try:
            back_to = group.from_release or "the previous templates"
            self.report(Event(group.name, "restore", "info", f"back to {back_to}"))
            step.phase("restore", lambda: self._replace_templates(previous) or "previous templates")
            step.phase("rollout", lambda: self.wait_ready(deadline))
            group.outcome = "restored"
        except Exception as exc:  # noqa: BLE001
            group.outcome, group.error = "failed", group.error or str(exc)
            return False
        return True
