"""What each runtime pod runs and whether it is ready: the Kubernetes answer to a host's facts.

``fab status`` and ``fab deploy --plan`` ask every target's hosts the same questions (release,
digest, running, ready, live); on Kubernetes the pods answer from their own objects, read from the
API server, without reaching into them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from frontier_hostside.names import K8S_RELEASE_ANNOTATION, K8S_TRACK_LABEL


@dataclass(frozen=True)
class PodFacts:
    current: str
    digest: str
    previous: str
    running: bool
    ready: bool
    live: bool
    track: str = ""
    # The kubelet's restarts of the runtime container, and the end of its last run.
    restarts: int = 0
    last_restart: str = ""

    def runs(self, release_id: str) -> bool:
        return self.current == release_id and self.ready


def pod_facts(pod: dict[str, Any]) -> PodFacts:
    meta, status = pod["metadata"], pod.get("status") or {}
    containers = status.get("containerStatuses") or []
    runtime = containers[0] if containers else {}
    image = runtime.get("imageID") or runtime.get("image", "")
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    ended = (runtime.get("lastState") or {}).get("terminated") or {}
    return PodFacts(
        current=str((meta.get("annotations") or {}).get(K8S_RELEASE_ANNOTATION, "")),
        digest=image.rpartition("@")[2] if "@" in image else "",
        previous="",  # a pod runs one release for its whole life; the Deployment keeps the revisions
        running=status.get("phase") == "Running",
        ready=conditions.get("Ready") == "True",
        live="running" in (runtime.get("state") or {}),
        track=str((meta.get("labels") or {}).get(K8S_TRACK_LABEL, "")),
        restarts=int(runtime.get("restartCount") or 0),
        last_restart=" ".join(str(ended[k]) for k in ("reason", "finishedAt") if ended.get(k)),
    )


@dataclass
class PodSession:
    """What ``backend.session(host)`` gives for a pod: its facts, nothing to close."""

    facts_now: PodFacts

    def facts(self, release_id: str = "") -> PodFacts:
        return self.facts_now

    def status(self) -> PodFacts:
        return self.facts_now

    def close(self) -> None:
        return None
