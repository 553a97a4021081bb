"""``deploy`` and ``rollback``: resolve the release, take the stack's lock, roll, record the outcome.

Both hand the release to the stack's target (:class:`frontier.rollout.target.Target`, which every
backend is); they differ only in where the release comes from. ``deploy`` renders this stack's
files for an artifact digest; ``rollback`` takes a release stored in the history bucket as it was
(no rebuild, no re-render), so the hosts get it byte for byte.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from frontier.config.schema import PoolSettings, Settings
from frontier.errors import FrontierError
from frontier.release.artifact import check_digest
from frontier.release.history import HistoryStore, Lease, iso, now, operator
from frontier.release.release import Release, check_release_id
from frontier.release.sbom import get_supply_chain
from frontier.release.signing import SigningError, check_release, find_release_key, sign_release
from frontier.render.release import build_release
from frontier.rollout.rolling import Event, Reporter, RolloutFailed, RolloutResult, waves
from frontier.rollout.target import Target
from frontier.rollout.weighted import MAX_WINDOWS


def lock_ttl_s(settings: Settings, pool: PoolSettings, host_count: int) -> float:
    """Long enough for a slow rollout of every host twice (there and back), never under an hour.

    The lock is a lease renewed while the deploy runs (a dead deploy's lock lapses within
    ``HistoryStore.lease_s``); this is the horizon beyond which even a live one's lock is up for
    taking, and until which hosts booting mid-deploy trust the release it rolls.

    Where the platform places the replicas (no host list), the pool's group's largest size counts.
    """
    host_count = host_count or pool.group.max_size
    r = settings.rollout
    per_host = (
        r.deregistration_delay_s
        + r.readiness_timeout_s
        + r.gate.window_s
        + pool.runtime.drain_timeout_s
        + 120
    )
    # A rollout by traffic share also holds each step, for up to MAX_WINDOWS gate windows.
    steps = len(r.traffic_steps) * MAX_WINDOWS * r.gate.window_s
    return max(3600.0, 2 * (per_host * max(1, host_count) + steps))


def deploy(target: Target, digest: str, *, reporter: Reporter | None = None) -> RolloutResult:
    """Roll the artifact ``digest`` with this stack's rendered files; raise RolloutFailed on failure."""
    check_digest(digest)  # a mutable tag is refused before anything is touched
    artifact = target.history_store().get_artifact(digest)
    release = build_release(target.settings, target.pool, artifact)
    return _roll(target, release, "deploy", reporter)


@dataclass(frozen=True)
class PlannedHost:
    wave: str
    host: str
    current: str
    target: str
    action: str  # "update" | "skip (already runs it)" | "unreachable: ..."


def plan(target: Target, release: Release) -> list[PlannedHost]:
    """What a rollout of ``release`` would do, host by host, without changing anything."""
    rollout = target.settings.rollout
    planned = []
    for wave_name, wave in waves(target.hosts(), rollout.canary_hosts, rollout.batch_size):
        for host in wave:
            try:
                session = target.session(host)
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


def deploy_plan(target: Target, digest: str) -> tuple[Release, list[PlannedHost]]:
    check_digest(digest)
    release = build_release(target.settings, target.pool, target.history_store().get_artifact(digest))
    return release, plan(target, release)


def rollback_target(target: Target, to: str | None = None) -> Release:
    """The release ``--to`` names, else the last good release before the one now deployed."""
    store = target.history_store()
    if to:
        return store.get_release(check_release_id(to))
    current = store.last_good()
    if current is None:
        raise FrontierError(
            f"stack {target.settings.stack!r} has no successful deploy in its history: nothing to roll back to"
        )
    previous = store.last_good(excluding=current["release"])
    if previous is None:
        raise FrontierError(
            f"stack {target.settings.stack!r}: {current['release']} is the only good release in the history; "
            "nothing earlier to roll back to"
        )
    return store.get_release(previous["release"])


def rollback(target: Target, to: str | None = None, *, reporter: Reporter | None = None) -> RolloutResult:
    return _roll(target, rollback_target(target, to), "rollback", reporter)


@runtime_checkable
class _ReachesAws(Protocol):
    """A target whose stack has AWS behind it (every backend): where its release key lives."""

    def aws_client(self, service: str) -> Any: ...


def signed_for_stack(target: Target, release: Release, kind: str) -> Release:
    """A deploy's release signed with the stack's release key; a rollback's stored release checked
    against it (never signed again: a history that was altered is refused, not laundered). A stack
    without a release key rolls its releases as they are; its hosts have no key to refuse them by."""
    if not isinstance(target, _ReachesAws):
        return release
    stack = target.settings.stack
    kms = target.aws_client("kms")
    key = find_release_key(kms, stack)
    if key is None:
        return release
    if kind == "deploy":
        release = sign_release(kms, key, stack, release)
    try:
        check_release(key, stack, release)
    except SigningError as exc:
        raise SigningError(f"{kind} refused: {exc}; deploy its digest again to sign it anew") from None
    return release


def _roll(target: Target, release: Release, kind: str, reporter: Reporter | None) -> RolloutResult:
    release = signed_for_stack(target, release, kind)  # before anything is stored or locked
    store = target.history_store()
    if release.artifact.kind == "wheel":
        store.fetch_artifact(release.artifact)  # a missing or corrupt wheel fails before the lock
    store.put_release(release)
    started = now()
    with store.leased(
        f"{kind} {release.id}", ttl_s=lock_ttl_s(target.settings, target.pool, target.rollout_size())
    ) as lease:
        if lease.info.replaced:
            (reporter or _quiet)(
                Event("-", "lock", "info", f"took over the lapsed lock of {lease.info.replaced}")
            )
        result = target.roll(release, kind, _stopping_when_lost(lease, reporter))
        # The stack's current release from now on: hosts that launch later bootstrap it.
        record = _record(target.settings, release, result, started)
        store.append({**record, **_supply_chain_fields(store, release)})
    if result.outcome != "succeeded":
        raise RolloutFailed(result)
    return result


def _quiet(event: Event) -> None:
    pass


def _stopping_when_lost(lease: Lease, reporter: Reporter | None) -> Reporter:
    """``reporter``, raising LockLost at the start of the first host step after the lease was lost.

    Every target reports each host step's start before taking it, so the rollout stops there and
    its failure path says why. Only once: the rollout's own way back (restoring the hosts it
    touched) then runs, since a host left stopped half-way serves nobody, and a deploy that took
    the lock over rolls every host from what it finds.
    """
    report = reporter or _quiet
    stopped = False

    def guarded(event: Event) -> None:
        nonlocal stopped
        if event.status == "start" and not stopped:
            try:
                lease.check()
            except Exception:
                stopped = True
                raise
        report(event)

    return guarded


def _supply_chain_fields(store: HistoryStore, release: Release) -> dict[str, Any]:
    """What ``fab history`` shows of the release's SBOM and audit (frontier.release.sbom)."""
    found = get_supply_chain(store, release.artifact)
    if found is None:
        return {"sbom_components": None, "audit": "no SBOM: built before SBOMs were made"}
    return {
        "sbom": found.sbom_digest,
        "sbom_components": found.components,
        "audit": found.audit.summary().removeprefix("audit: "),
    }


def _record(
    settings: Settings, release: Release, result: RolloutResult, started: dt.datetime
) -> dict[str, Any]:
    return {
        "kind": result.kind,
        "stack": settings.stack,
        "who": operator(),
        "started_at": iso(started),
        "finished_at": iso(now()),
        "duration_s": result.duration_s,
        "digest": release.digest,
        "config_hash": release.config_hash,
        "release": release.id,
        # The release key that signed it ("" on a stack without one): hosts ran only that.
        "signed_by": json.loads(release.signature)["key_id"] if release.signature else "",
        "outcome": result.outcome,
        "reason": result.reason,
        # surge or one-unavailable, and why (frontier.rollout.strategy)
        "strategy": result.strategy,
        "hosts": [h.to_record() for h in result.hosts],
        # A traffic-weighted rollout's steps: the share, both releases' series, the verdict.
        **({"steps": [step.to_record() for step in result.steps]} if result.steps else {}),
    }
