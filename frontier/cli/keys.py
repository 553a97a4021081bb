"""``keys.rotate``: a new runtime API key without a restart, the old one retired after an overlap.

Each pool's runtimes read a secret of their own: a rotation is one pool's (``--model``), or every
pool's one after another, each pool's secret watched on that pool's replicas alone."""

from __future__ import annotations

from dataclasses import dataclass

from invoke import Collection, task
from invoke.exceptions import Exit
from rich.console import Console

from frontier.access.keys import Replica, RotationError, rotate, timing_problems
from frontier.cli import tables
from frontier.cli.common import reports_errors, settings_for
from frontier.config.schema import PoolSettings, Settings
from frontier.hosts.inventory import HostSpec
from frontier.targets import backend_for

STACK = "stack name (default $FRONTIER_STACK, else local)"


def _reload_interval(settings: Settings, pool: PoolSettings) -> tuple[float, str]:
    """The slowest reader of ``pool``'s secret (its runtimes, the gateway), and the setting that says so."""
    reload_s, field = pool.runtime.api_keys_reload_s, "runtime.api_keys_reload_s"
    if settings.gateway is not None and settings.gateway.keys_reload_s > reload_s:
        reload_s, field = settings.gateway.keys_reload_s, "gateway.keys_reload_s"
    return reload_s, field


def _replicas(settings: Settings, pool: PoolSettings) -> list[Replica]:
    """Every runtime of ``pool`` (the readers of its secret), reached through its host's session like
    every host task."""
    backend = backend_for(settings.for_pool(pool.name))
    return [Replica(f"{pool.name}/{host.name}", _scraper(backend, host)) for host in backend.hosts()]


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


@dataclass(frozen=True)
class _Plan:
    """One pool's rotation: its secret and the timings it runs with."""

    pool: PoolSettings
    secret_id: str
    wait_s: float
    overlap_s: float
    reload_s: float
    field: str


def _plans(settings: Settings, model: str | None, wait_s: str | None, overlap_s: str | None) -> list[_Plan]:
    """What each pool to rotate (``model``'s, or every pool's) runs with; refused whole, before any
    secret is written, where one pool's cannot work."""
    try:
        pools = [settings.pool(model)] if model else list(settings.pools)
    except KeyError as exc:
        raise Exit(f"error: --model: {exc.args[0]}", code=2) from None
    plans, problems = [], []
    for pool in pools:
        secret_id = pool.runtime.api_keys_secret or ""  # required of every pool a stack deploys
        reload_s, field = _reload_interval(settings, pool)
        wait = _seconds("--wait-s", wait_s, 2 * reload_s + 30)
        overlap = _seconds("--overlap-s", overlap_s, 2 * reload_s)
        whose = f"model {pool.name}: " if len(settings.pools) > 1 else ""
        problems += [whose + problem for problem in timing_problems(wait, overlap, reload_s, field)]
        plans.append(_Plan(pool, secret_id, wait, overlap, reload_s, field))
    if problems:
        raise Exit("\n".join(f"error: {p}" for p in dict.fromkeys(problems)), code=2)
    return plans


@task(
    help={
        "stack": STACK,
        "model": "the model pool whose secret to rotate (default: every pool's, one after another)",
        "wait_s": "how long every replica may take to serve a new key set (default: 2 reload intervals + 30 s)",
        "overlap_s": "how long old and new keys both work before the old one is retired (default: 2 reload intervals)",
    }
)
@reports_errors
def rotate_keys(c, stack=None, model=None, wait_s=None, overlap_s=None):
    """Add a new runtime API key to each pool's own secret, wait until every replica of the pool serves
    it, retire the old one after the overlap; one pool after another, or ``--model``'s alone."""
    settings = settings_for(stack)
    plans = _plans(settings, model, wait_s, overlap_s)
    console = tables.console()
    for plan in plans:
        _rotate(settings, plan, console)


def _rotate(settings: Settings, plan: _Plan, console: Console) -> None:
    secret_id = plan.secret_id
    replicas = _replicas(settings, plan.pool)
    console.print(
        f"rotating {secret_id} (model {plan.pool.name}) on stack {settings.stack}: {len(replicas)} replicas, "
        f"overlap {plan.overlap_s:g} s, wait up to {plan.wait_s:g} s per step ({plan.field} = {plan.reload_s:g})"
    )
    try:
        rotation = rotate(
            backend_for(settings).aws_client("secretsmanager"),
            secret_id,
            replicas,
            wait_s=plan.wait_s,
            overlap_s=plan.overlap_s,
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
