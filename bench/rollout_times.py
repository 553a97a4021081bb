"""Rollout and rollback times on a real three-host cluster on this machine.

    .venv/bin/python bench/rollout_times.py [--hosts 3] [--clients 2]

The cluster is the operate tests' harness: one sshd per host on loopback aliases, HAProxy, moto's
server, the tiny model, the runtime wheel. It deploys release A onto empty hosts, rolls release B
(a changed batching setting) over them while clients send requests through HAProxy, then rolls
back to A, and prints, per host and phase, where the time went, plus requests sent and failed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "operate"))

from harness import API_KEY, make_tiny_model, push_model, register_wheel, start_cluster  # noqa: E402

from frontier.rollout.deploy import deploy, rollback  # noqa: E402
from frontier.rollout.rolling import RolloutResult  # noqa: E402

PHASES = ("check", "stage", "drain", "stop", "start", "readiness", "enable", "gate", "prune")


class Clients:
    """A few clients sending small completions through the balancer; counts what failed."""

    def __init__(self, url: str, model: str, clients: int) -> None:
        self.url, self.model, self.clients = url, model, clients
        self.sent = self.failed = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def _run(self) -> None:
        with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {API_KEY}"}) as http:
            while not self._stop.is_set():
                try:
                    reply = http.post(
                        self.url, json={"model": self.model, "prompt": "deploy", "max_tokens": 8}
                    )
                    ok, why = reply.status_code == 200, f"HTTP {reply.status_code}"
                except httpx.HTTPError as exc:
                    ok, why = False, type(exc).__name__
                with self._lock:
                    self.sent += 1
                    if not ok:
                        self.failed += 1
                        self.errors.append(why)

    def __enter__(self) -> Clients:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()


def phase_table(title: str, result: RolloutResult) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("host")
    for phase in PHASES:
        table.add_column(phase, justify="right")
    table.add_column("out of service", justify="right")
    table.add_column("host total", justify="right")
    for host in result.hosts:
        total = sum(host.phases.values())
        cells = [f"{host.phases[p]:.2f}" if p in host.phases else "-" for p in PHASES]
        table.add_row(host.name, *cells, f"{host.out_of_service_s:.2f}", f"{total:.2f}")
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=3, choices=range(2, 9))
    parser.add_argument("--clients", type=int, default=2, help="concurrent clients during B and the rollback")
    args = parser.parse_args()
    console = Console(width=160)
    with tempfile.TemporaryDirectory(prefix="frontier-bench-") as tmp:
        base = Path(tmp)
        cluster = start_cluster(base / "cluster", args.hosts)
        try:
            push_model(cluster, make_tiny_model(base / "model"))
            wheel = register_wheel(cluster, cache=base / "artifacts")
            first = deploy(cluster.backend(), wheel.digest)
            url = f"http://127.0.0.1:{cluster.settings.local.balancer_port}/v1/completions"
            with Clients(url, cluster.settings.model.name, args.clients) as load:
                settings_b = cluster.variant("b", {"runtime.batch.max_batch_size": 8})
                roll = deploy(cluster.backend(settings_b), wheel.digest)
                back = rollback(cluster.backend())
        finally:
            cluster.stop()
    console.print(phase_table(f"deploy A onto empty hosts: {first.duration_s:.1f}s", first))
    console.print(phase_table(f"deploy B over A (under load): {roll.duration_s:.1f}s", roll))
    console.print(phase_table(f"rollback to A (under load): {back.duration_s:.1f}s", back))
    per_host = [sum(h.phases.values()) for h in roll.hosts]
    summary = Table(title="summary", title_justify="left")
    for column in ("measure", "value"):
        summary.add_column(column)
    summary.add_row("hosts", str(args.hosts))
    summary.add_row("rollout B: total", f"{roll.duration_s:.1f} s")
    summary.add_row("rollout B: per host (mean of host totals)", f"{sum(per_host) / len(per_host):.1f} s")
    summary.add_row(
        "rollout B: out of service per host (mean)",
        f"{sum(h.out_of_service_s for h in roll.hosts) / len(roll.hosts):.1f} s",
    )
    summary.add_row("rollback to A: total", f"{back.duration_s:.1f} s")
    summary.add_row("requests through HAProxy during B + rollback", f"{load.sent} sent, {load.failed} failed")
    console.print(summary)
    if load.errors:
        console.print(f"failures: {sorted(set(load.errors))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
