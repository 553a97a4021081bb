"""``keys.rotate``: a new runtime API key without a restart, the old one retired after an overlap."""

from __future__ import annotations

from invoke import Collection, task
from invoke.exceptions import Exit

from frontier.access.keys import Replica, RotationError, rotate, timing_problems
from frontier.cli import tables
from frontier.cli.common import reports_errors, settings_for
from frontier.config.schema import Settings
from frontier.hosts.inventory import HostSpec
from frontier.targets import backend_for

STACK = "stack name (default $FRONTIER_STACK, else local)"


def _reload_interval(settings: Settings) -> tuple[float, str]:
    """The slowest reader of the runtimes' secret, and the setting that says so."""
    slowest = max(settings.pools, key=lambda pool: pool.runtime.api_keys_reload_s)
    reload_s, field = slowest.runtime.api_keys_reload_s, "runtime.api_keys_reload_s"
    if settings.gateway is not None and settings.gateway.keys_reload_s > reload_s:
        reload_s, field = settings.gateway.keys_reload_s, "gateway.keys_reload_s"
    return reload_s, field


def _replicas(settings: Settings, secret_id: str) -> list[Replica]:
    """Every runtime that reads ``secret_id``, reached through its host's session like every host task."""
    replicas = []
    for pool in settings.pools:
        if pool.runtime.api_keys_secret != secret_id:
            continue
        backend = backend_for(settings.for_pool(pool.name))
        for host in backend.hosts():
            replicas.append(Replica(f"{pool.name}/{host.name}", _scraper(backend, host)))
    return replicas


def _scraper(backend, host: HostSpec):  # type: ignore[no-untyped-def]
    def metrics() -> str:
        session = backend.session(host)
        try:
            return session.metrics()
        finally:
            session.close()

    return metrics


def _seconds(option: str, value: str | None, default: float) -> float:
    if value is None:
        return default
    try:
        return float(value)
    except ValueError:
        raise Exit(f"error: {option} {value!r}: must be a number of seconds", code=2) from None


@task(
    help={
        "stack": STACK,
        "wait_s": "how long every replica may take to serve a new key set (default: 2 reload intervals + 30 s)",
        "overlap_s": "how long old and new keys both work before the old one is retired (default: 2 reload intervals)",
    }
)
@reports_errors
def rotate_keys(c, stack=None, wait_s=None, overlap_s=None):
    """Add a new runtime API key, wait until every replica serves it, retire the old one after the overlap."""
    settings = settings_for(stack)
    secret_id = settings.api_keys_secret
    if not secret_id:
        raise Exit("error: runtime.api_keys_secret is not set: the stack's runtimes take no API key", code=2)
    reload_s, field = _reload_interval(settings)
    wait = _seconds("--wait-s", wait_s, 2 * reload_s + 30)
    overlap = _seconds("--overlap-s", overlap_s, 2 * reload_s)
    problems = timing_problems(wait, overlap, reload_s, field)
    if problems:
        raise Exit("\n".join(f"error: {p}" for p in problems), code=2)
    replicas = _replicas(settings, secret_id)
    console = tables.console()
    console.print(
        f"rotating {secret_id} on stack {settings.stack}: {len(replicas)} replicas, "
        f"overlap {overlap:g} s, wait up to {wait:g} s per step ({field} = {reload_s:g})"
    )
    try:
        rotation = rotate(
            backend_for(settings).aws_client("secretsmanager"),
            secret_id,
            replicas,
            wait_s=wait,
            overlap_s=overlap,
            progress=console.print,
        )
    except RotationError as exc:
        raise Exit(f"error: {exc}", code=1) from None
    rows = [
        (step.what, step.fingerprint, name, f"{seconds:g}")
        for step in rotation.steps
        for name, seconds in sorted(step.replicas.items())
    ]
    console.print(
        tables.table(
            f"key rotation of {secret_id}", ("step", "key set", "replica", "after s"), rows, numeric=(3,)
        )
    )
    console.print(
        f"done: {rotation.retired} old key(s) retired; the new key is the first of {secret_id} (never printed)"
    )
    refreshed = backend_for(settings).api_keys_rotated(secret_id)
    if refreshed:
        console.print(refreshed)


def register(namespace: Collection) -> None:
    namespace.add_collection(Collection("keys", rotate=rotate_keys))
