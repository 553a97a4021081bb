"""Spot notices on the local stack: what ``fab spot.notice`` posts, and what the slot made of it.

Each host slot's IMDS stand-in (started by ``local.up``, :mod:`frontier.targets.local.imds`) takes
a notice on its control endpoint, as AWS would raise one in the instance's metadata; the slot's
interruption watcher finds it at its next poll and acts as on EC2 (a spot notice: the gateway is
told, the runtime drains and stops; a rebalance recommendation: recorded only). :func:`post`
raises the notice, :func:`wait_handled` reads the slot's ``run/interruption.json`` until the watcher
has handled it, and :func:`warm_replacement` is the group's answer to a rebalance recommendation.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from frontier_hostside.interruption import read_record

from frontier.config.schema import Host, PoolSettings, Settings
from frontier.targets.local import cluster, services
from frontier.targets.local.backend import LocalBackend
from frontier.targets.local.group import Warmed
from frontier.targets.local.imds import MAX_NOTICE_IN_S, SPOT_ACTIONS, SPOT_NOTICE_S

KINDS = ("spot", "rebalance")


@dataclass(frozen=True)
class Posted:
    """A notice the slot's IMDS now holds."""

    host: str
    kind: str  # spot | rebalance
    notice: dict[str, str]  # what IMDS answers on the notice's path
    imds: str  # the stand-in's URL


def slot(settings: Settings, name: str) -> Host:
    """The host slot called ``name``; an error naming the slots the stack has otherwise."""
    for host in settings.inventory.hosts:
        if host.name == name:
            return host
    known = ", ".join(h.name for h in settings.inventory.hosts)
    raise cluster.LocalStackError(
        f"--host {name!r}: stack {settings.stack!r} has no such slot (its slots: {known})"
    )


def post(
    settings: Settings, name: str, kind: str = "spot", action: str = "terminate", in_s: float = SPOT_NOTICE_S
) -> Posted:
    """Raise a notice on slot ``name``'s IMDS: a spot interruption (``action`` at ``in_s`` seconds
    from now) or a rebalance recommendation. Bad values are refused before anything is posted."""
    cluster.require_local(settings, "spot.notice posts to the local stack's IMDS stand-in; on EC2 AWS raises "
                          "the notice (rehearse one with AWS FIS: aws:ec2:send-spot-instance-interruptions)")  # fmt: skip
    if kind not in KINDS:
        raise cluster.LocalStackError(f"kind = {kind!r}: must be one of {', '.join(KINDS)}")
    if action not in SPOT_ACTIONS:
        raise cluster.LocalStackError(f"--action {action!r}: must be one of {', '.join(SPOT_ACTIONS)}")
    if not 0 <= in_s <= MAX_NOTICE_IN_S:
        raise cluster.LocalStackError(
            f"--in-s {in_s:g}: must be between 0 and {MAX_NOTICE_IN_S:g} seconds (EC2 gives {SPOT_NOTICE_S:g})"
        )
    host = slot(settings, name)
    stand_in = services.find(cluster.state_dir(settings), cluster.imds_service(host))
    if stand_in is None:
        raise cluster.LocalStackError(
            f"{host.name}: no IMDS stand-in runs for it — run `fab local.up --stack {settings.stack}` first"
        )
    body: dict[str, Any] = {"action": action, "in_s": in_s} if kind == "spot" else {}
    notice = _post_json(f"{stand_in.endpoint}/control/{kind}", body)
    return Posted(host.name, kind, notice, stand_in.endpoint)


def wait_handled(settings: Settings, posted: Posted, timeout_s: float) -> dict[str, Any] | None:
    """The slot's record of the posted notice once its watcher has handled it (a spot notice: once
    the runtime has stopped); None if that did not happen within ``timeout_s``."""
    root = cluster.host_root(slot(settings, posted.host))
    at = posted.notice.get("time") or posted.notice.get("noticeTime")
    deadline = time.monotonic() + timeout_s
    while True:
        for entry in read_record(root / "run"):
            notice = entry.get("notice") or {}
            ours = notice.get("kind") == posted.kind and notice.get("at") == at
            if ours and (not entry.get("out_of_service") or "stop" in entry):
                return entry
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.1)


def warm_replacement(settings: Settings, pool: PoolSettings, say: Callable[[str], None]) -> Warmed | None:
    """The group's answer to a rebalance recommendation, as the local stack stands in for it: a
    spare slot of ``pool``'s group (the pool of the host at risk) warmed for its current release
    (staged, its weights cache filled with what its start reads) and left out of service, so the
    replacement that takes over from the host at risk fetches no weights when it launches. None
    where the group has no spare slot."""
    fleet = LocalBackend(settings, pool).fleet()
    fleet.say = say
    return fleet.warm(settings.rollout.readiness_timeout_s + 60)


def _post_json(url: str, body: dict[str, Any]) -> dict[str, str]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    # The stand-in is on loopback: never through a proxy, whatever http_proxy says.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=5) as reply:
            data = json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        raise cluster.LocalStackError(
            f"{url} refused the notice: {exc.read().decode(errors='replace')}"
        ) from None
    except (OSError, ValueError) as exc:
        raise cluster.LocalStackError(f"{url}: {exc}") from None
    return {str(k): str(v) for k, v in data.items()}
