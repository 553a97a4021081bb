"""``fab soak``: a stack held at a fraction of its knee for a set time, judged for leaks and drift."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from invoke import Collection, task
from invoke.exceptions import Exit
from rich.table import Table

from frontier.capacity.baseline import load_baseline
from frontier.cli.common import reports_errors, settings_for
from frontier.cli.local import STACK_HELP, default_api_key, default_target_url
from frontier.config.load import chosen_pool
from frontier.config.schema import Settings
from frontier.hosts.session import HostSession
from frontier.loadtest.client import Target
from frontier.loadtest.report import wide_console
from frontier.loadtest.soak import MB, SoakError, SoakLimits, SoakReport, Window, p99_of, run_soak
from frontier.targets import backend_for


@task(
    help={
        "stack": STACK_HELP,
        "duration": "seconds to hold the load (default 1800)",
        "fraction": "share of the knee to hold (default 0.5; the knee: the stack's baseline x its hosts)",
        "rate": "requests/s to hold instead of a fraction of the knee",
        "interval": "seconds between readings of every replica's /metrics (default 15)",
        "url": "the endpoint to load (default: the stack's)",
        "rss-growth-mb-per-h": "limit on each replica's RSS slope (default 64)",
        "kv-peak-usage": "limit on the KV cache's peak usage (default 0.95)",
        "error-rate-drift": "limit on the error rate's rise, last quarter vs first (default 0.005)",
        "p99-drift": "limit on the p99 latency's ratio, last quarter vs first (default 1.5)",
    }
)
@reports_errors
def soak(
    c,
    stack=None,
    duration=1800.0,
    fraction=0.5,
    rate=None,
    interval=15.0,
    url=None,
    rss_growth_mb_per_h=64.0,
    kv_peak_usage=0.95,
    error_rate_drift=0.005,
    p99_drift=1.5,
):
    """Hold a steady load for a long time; judge RSS slope, KV usage, error and latency drift and
    restarts against their limits; exit 1 when any check fails."""
    settings = settings_for(stack)
    limits = SoakLimits(
        rss_growth_mb_per_h=float(rss_growth_mb_per_h),
        kv_peak_usage=float(kv_peak_usage),
        error_rate_drift=float(error_rate_drift),
        p99_drift=float(p99_drift),
    )
    backend = backend_for(settings)
    hosts = {h.name: h for h in backend.hosts()}
    load_rate = float(rate) if rate is not None else _knee_fraction(settings, float(fraction), len(hosts))
    target = Target(
        base_url=url or default_target_url(settings),
        model=chosen_pool(settings).name,
        api_key=default_api_key(settings),
        prompt_tokens=settings.capacity.avg_prompt_tokens,
        max_tokens=settings.capacity.avg_output_tokens,
    )
    console = wide_console()
    console.print(
        f"soak of {target.url}: {load_rate:g} req/s for {float(duration):g}s, reading {len(hosts)} replica(s) "
        f"every {float(interval):g}s"
    )
    with _sessions(settings, backend, hosts) as sessions:

        def read_metrics(name: str) -> str | None:
            try:
                return sessions[name].metrics()
            except Exception:  # noqa: BLE001 - a replica that does not answer is what a soak looks for
                return None

        report = run_soak(
            target,
            sorted(hosts),
            read_metrics,
            rate=load_rate,
            duration_s=float(duration),
            interval_s=float(interval),
            limits=limits,
            on_window=lambda w: console.print(_window_line(w)),
        )
    console.print(windows_table(report))
    console.print(checks_table(report))
    print(
        f"soak: sent={report.sent} failed={report.failed} checks={sum(c.ok for c in report.checks)}/"
        f"{len(report.checks)} {'ok' if report.ok else 'FAILED'}"
    )
    if not report.ok:
        raise Exit(code=1)


def _knee_fraction(settings: Settings, fraction: float, hosts: int) -> float:
    if not 0 < fraction <= 1:
        raise SoakError(f"--fraction {fraction!r}: must lie in (0, 1]")
    baseline = load_baseline(settings.stack)
    if baseline is None:
        raise SoakError(
            f"stack {settings.stack!r} has no baseline to take a fraction of its knee from: run "
            f"`fab loadtest -s {settings.stack} --step ...` first, or give --rate"
        )
    return round(fraction * baseline.replica_qps * max(1, hosts), 2)


@contextlib.contextmanager
def _sessions(settings: Settings, backend, hosts) -> Iterator[dict[str, HostSession]]:
    sessions = {name: HostSession(settings, backend.pool, host, backend.connect(host)) for name, host in hosts.items()}
    try:
        yield sessions
    finally:
        for session in sessions.values():
            with contextlib.suppress(Exception):
                session.close()


def _window_line(w: Window) -> str:
    rss = " ".join(
        f"{r.replica} {r.rss_bytes / MB:.0f}MB" if r.rss_bytes is not None else f"{r.replica} -"
        for r in w.readings
    )
    kv = max((r.kv_usage for r in w.readings if r.kv_usage is not None), default=0.0)
    return f"  {w.end:7.0f}s  {len(w.samples):5d} done  {w.failed:3d} failed  KV {kv:4.0%}  RSS {rss}"


def windows_table(report: SoakReport, rows: int = 12) -> Table:
    """The soak in at most ``rows`` stretches: requests, errors, p99, RSS and KV of each."""
    table = Table(title=f"soak: {report.rate:g} req/s for {report.duration_s:g}s", title_justify="left")
    for name in ("from s", "to s", "requests", "failed", "p99 ms", "RSS MB (each replica)", "KV peak"):
        table.add_column(name, justify="right")
    windows = report.windows
    size = max(1, -(-len(windows) // rows))
    for i in range(0, len(windows), size):
        chunk = windows[i : i + size]
        samples = [s for w in chunk for s in w.samples]
        p99 = p99_of(samples)
        last = chunk[-1].readings
        table.add_row(
            f"{chunk[0].start:.0f}",
            f"{chunk[-1].end:.0f}",
            str(len(samples)),
            str(sum(1 for s in samples if not s.ok)),
            "-" if p99 is None else f"{p99 * 1e3:,.0f}",
            " ".join("-" if r.rss_bytes is None else f"{r.rss_bytes / MB:.0f}" for r in last),
            f"{max((r.kv_usage for w in chunk for r in w.readings if r.kv_usage is not None), default=0.0):.0%}",
        )
    return table


def checks_table(report: SoakReport) -> Table:
    table = Table(title="soak: checks", title_justify="left")
    for name in ("check", "measured", "limit", "verdict"):
        table.add_column(name)
    for check in report.checks:
        table.add_row(check.name, check.measured, check.limit, "ok" if check.ok else "FAILED")
    return table


def register(namespace: Collection) -> None:
    namespace.add_task(soak)
