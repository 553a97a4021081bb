"""``deploy`` and ``rollback``: resolve the release, take the stack's lock, roll, record the outcome.

Both end in :class:`frontier.rollout.rolling.Rollout`; they differ only in where the release comes from.
``deploy`` renders this stack's files for an artifact digest; ``rollback`` takes a release stored
in the history bucket as it was (no rebuild, no re-render), so the hosts get it byte for byte.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from frontier.backends import backend_for
from frontier.backends.common import roll_hosts
from frontier.config.schema import Settings
from frontier.errors import FrontierError
from frontier.fleet.balancer import Balancer
from frontier.fleet.inventory import HostSpec
from frontier.release.history import HistoryStore, iso, now, operator
from frontier.release.release import Release, build_release, check_release_id
from frontier.render.files import check_digest
from frontier.rollout.rolling import Reporter, RolloutFailed, RolloutResult


@dataclass
class Environment:
    """Everything a rollout talks to; tests and the bench build one by hand, tasks from the stack."""

    settings: Settings
    store: HistoryStore
    balancer: Balancer | None
    hosts: list[HostSpec]
    connect: Callable[[HostSpec], Any]
    #: How the target rolls a release (the backend's); None: the host rollout over the fields above.
    roll: Callable[[Release, str, Reporter | None], RolloutResult] | None = None
    #: What a host (or pod) says it runs (the backend's); None: the host agent over ``connect``.
    session: Callable[[HostSpec], Any] | None = None

    @classmethod
    def for_stack(cls, settings: Settings) -> Environment:
        backend = backend_for(settings)
        return cls(
            settings=settings,
            store=backend.history_store(),
            balancer=backend.balancer(),
            hosts=backend.hosts(),
            connect=backend.connect,
            roll=backend.roll,
            session=backend.session,
        )


def lock_ttl_s(settings: Settings, host_count: int) -> float:
    """Long enough for a slow rollout of every host twice (there and back), never under an hour.

    Where the platform places the replicas (no host list), the serving group's largest size counts.
    """
    host_count = host_count or settings.serving_group.max_size
    r = settings.rollout
    per_host = (
        r.deregistration_delay_s
        + r.readiness_timeout_s
        + r.gate.window_s
        + settings.runtime.drain_timeout_s
        + 120
    )
    return max(3600.0, 2 * per_host * max(1, host_count))


def deploy(env: Environment, digest: str, *, reporter: Reporter | None = None) -> RolloutResult:
    """Roll the artifact ``digest`` with this stack's rendered files; raise RolloutFailed on failure."""
    check_digest(digest)  # a mutable tag is refused before anything is touched
    artifact = env.store.get_artifact(digest)
    release = build_release(env.settings, artifact)
    return _roll(env, release, "deploy", reporter)


@dataclass(frozen=True)
class PlannedHost:
    wave: str
    host: str
    current: str
    target: str
    action: str  # "update" | "skip (already runs it)" | "unreachable: ..."


def plan(env: Environment, release: Release) -> list[PlannedHost]:
    """What a rollout of ``release`` would do, host by host, without changing anything."""
    from frontier.fleet.host import HostSession
    from frontier.rollout.rolling import waves

    rollout = env.settings.rollout
    planned = []
    for wave_name, wave in waves(env.hosts, rollout.canary_hosts, rollout.batch_size):
        for host in wave:
            try:
                session = (
                    env.session(host) if env.session else HostSession(env.settings, host, env.connect(host))
                )
                try:
                    facts = session.facts(release.id)
                finally:
                    session.close()
            except FrontierError as exc:
                planned.append(PlannedHost(wave_name, host.name, "?", release.id, f"unreachable: {exc}"))
                continue
            same = facts.runs(release.id)
            action = "skip (already runs it)" if same else "update"
            planned.append(PlannedHost(wave_name, host.name, facts.current or "-", release.id, action))
    return planned


def deploy_plan(env: Environment, digest: str) -> tuple[Release, list[PlannedHost]]:
    check_digest(digest)
    release = build_release(env.settings, env.store.get_artifact(digest))
    return release, plan(env, release)


def rollback_target(env: Environment, to: str | None = None) -> Release:
    """The release ``--to`` names, else the last good release before the one now deployed."""
    if to:
        return env.store.get_release(check_release_id(to))
    current = env.store.last_good()
    if current is None:
        raise FrontierError(
            f"stack {env.settings.stack!r} has no successful deploy in its history: nothing to roll back to"
        )
    previous = env.store.last_good(excluding=current["release"])
    if previous is None:
        raise FrontierError(
            f"stack {env.settings.stack!r}: {current['release']} is the only good release in the history; "
            "nothing earlier to roll back to"
        )
    return env.store.get_release(previous["release"])


def rollback(env: Environment, to: str | None = None, *, reporter: Reporter | None = None) -> RolloutResult:
    return _roll(env, rollback_target(env, to), "rollback", reporter)


def _roll_hosts(env: Environment) -> Callable[[Release, str, Reporter | None], RolloutResult]:
    if env.balancer is None:
        raise FrontierError(f"stack {env.settings.stack!r}: no balancer to roll hosts behind")
    balancer = env.balancer
    return lambda release, kind, reporter: roll_hosts(
        env.settings, env.store, env.hosts, balancer, env.connect, release, kind, reporter
    )


def _roll(env: Environment, release: Release, kind: str, reporter: Reporter | None) -> RolloutResult:
    roll = env.roll or _roll_hosts(env)
    if release.artifact.kind == "wheel":
        env.store.fetch_artifact(release.artifact)  # a missing or corrupt wheel fails before the lock
    env.store.put_release(release)
    started = now()
    with env.store.locked(f"{kind} {release.id}", ttl_s=lock_ttl_s(env.settings, len(env.hosts))):
        result = roll(release, kind, reporter)
        # The stack's current release from now on: hosts that launch later bootstrap it.
        env.store.append(_record(env, release, result, started))
    if result.outcome != "succeeded":
        raise RolloutFailed(result)
    return result


def _record(
    env: Environment, release: Release, result: RolloutResult, started: dt.datetime
) -> dict[str, Any]:
    return {
        "kind": result.kind,
        "stack": env.settings.stack,
        "who": operator(),
        "started_at": iso(started),
        "finished_at": iso(now()),
        "duration_s": result.duration_s,
        "digest": release.digest,
        "config_hash": release.config_hash,
        "release": release.id,
        "outcome": result.outcome,
        "reason": result.reason,
        # surge or one-unavailable, and why (frontier.rollout.strategy)
        "strategy": result.strategy,
        "hosts": [h.to_record() for h in result.hosts],
    }
