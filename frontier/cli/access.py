"""The access layer's tasks: ``usage`` (metering sums with cost) and ``batch`` (an OpenAI Batch file
through the gateway at batch priority, resumable)."""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from pathlib import Path

from invoke import Collection, task
from invoke.exceptions import Exit
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from frontier.access import batch as batches
from frontier.access import usage as metering
from frontier.access.report import usage_table
from frontier.cli import tables
from frontier.cli.common import reports_errors, settings_for
from frontier.targets import backend_for

STACK = "stack name (default $FRONTIER_STACK, else local)"


@task(help={"stack": STACK})
@reports_errors
def usage(c, stack=None):
    """Requests, tokens and cost per tenant and model, summed from the gateway's metering records."""
    settings = settings_for(stack)
    uri = metering.metering_uri(settings)
    s3 = backend_for(settings).aws_client("s3") if uri.startswith("s3://") else None
    found = metering.read_records(uri, s3=s3)
    prices = metering.output_token_prices(settings)
    rows = metering.sum_usage(found.records, prices)
    console = tables.console()
    console.print(usage_table(settings.stack, uri, rows, prices))
    if found.skipped:
        console.print(
            f"[yellow]{len(found.skipped)} line(s) were not records and were left out[/]: "
            + "; ".join(found.skipped[:5])
        )
    total = sum(r.cost_usd for r in rows)
    print(
        f"usage: records={len(found.records)} tenants={len({r.tenant for r in rows})} models={len({r.model for r in rows})} cost_usd={total:.6f}"
    )


@task(
    help={
        "stack": STACK,
        "model": "the model every line is sent to (a line naming another model is refused)",
        "input": "OpenAI Batch-format JSON lines: custom_id, method, url, body",
        "output": "results, one line per input line; an existing file resumes the job",
        "key": "the tenant's API key (default $FRONTIER_API_KEY); a stack with a gateway needs one",
        "url": "the gateway's address (default: the stack's endpoint, its gateway where it has one)",
        "concurrency": "requests in flight at once (default 8)",
        "retry_failed": "resend the lines an earlier run failed for a reason a retry can fix "
        "(429, 408, 5xx, refused connection, timeout)",
        "retry_status": "resend the lines an earlier run failed with these statuses too, e.g. 401,422 "
        "once the key or the lines are fixed",
        "attempts": "tries per line within this run for 429/502/503/504 and lost connections (default 8)",
        "timeout": "seconds to wait for one answer (default 600)",
    }
)
@reports_errors
def batch(
    c,
    stack=None,
    model=None,
    input=None,  # noqa: A002
    output=None,
    key=None,
    url=None,
    concurrency=8,
    retry_failed=False,
    retry_status="",
    attempts=8,
    timeout=600.0,
):
    """Run a Batch file through the gateway at batch priority; resumable, one result per line."""
    if not (model and input and output):
        raise Exit("error: --model, --input and --output are required", code=2)
    settings = settings_for(stack)
    try:
        settings.pool(model)
    except KeyError as exc:
        raise Exit(f"error: --model: {exc.args[0]}", code=2) from None
    for name, value in (("--concurrency", concurrency), ("--attempts", attempts)):
        if not str(value).isdigit() or int(value) < 1:
            raise Exit(f"error: {name} must be a whole number >= 1, got {value!r}", code=2)
    try:
        timeout_s = float(timeout)
    except ValueError:
        timeout_s = 0.0
    if timeout_s <= 0:
        raise Exit(f"error: --timeout must be a number of seconds > 0, got {timeout!r}", code=2)
    retry = batches.RetryPolicy(bool(retry_failed), _statuses(retry_status))
    backend = backend_for(settings)
    # The stack's endpoint is its gateway where it has one: tenants, batch priority and metering
    # apply there, and the runtimes behind it take no tenant's key.
    url = url or backend.endpoint()
    api_key = key or os.environ.get("FRONTIER_API_KEY") or backend.api_key()
    if not api_key and settings.gateway is not None:
        tenants = ", ".join(t.name for t in settings.tenants if model in t.models)
        raise Exit(
            f"error: --key: stack {settings.stack!r} has a gateway, and a batch runs as one of its tenants "
            f"(those that may use {model!r}: {tenants or 'none'}); give that tenant's key with --key or "
            "$FRONTIER_API_KEY",
            code=2,
        )
    requests, bad, lines = batches.read_input(Path(input), model)
    results = batches.ResultFile(Path(output))
    console = tables.console()
    for item in bad:
        console.print(f"[yellow]malformed[/] {item.message}")
    progress = Progress(
        TextColumn(f"batch {model}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=console,
    )
    try:
        with progress:
            bar = progress.add_task("batch", total=None, status="")
            counts: Counter[str] = Counter()

            def on_start(count: int) -> None:
                progress.update(bar, total=count)

            def on_result(result: dict) -> None:
                counts[batches.Recorded.of(result).outcome] += 1
                progress.update(
                    bar, advance=1, status=" ".join(f"{k} {v}" for k, v in sorted(counts.items()))
                )

            summary = asyncio.run(
                batches.run_batch(
                    url,
                    api_key,
                    requests,
                    bad,
                    results,
                    concurrency=int(concurrency),
                    max_attempts=int(attempts),
                    on_result=on_result,
                    on_start=on_start,
                    timeout_s=timeout_s,
                    retry=retry,
                )
            )
    finally:
        results.close()
    console.print(_batch_table(f"batch {input} -> {output}", summary))
    print(
        f"batch: lines={lines} done_before={summary.already_done} succeeded={summary.succeeded} "
        f"failed={summary.failed} not_retried={summary.left_failed} malformed={summary.malformed} "
        f"results={len(results.recorded)}"
    )
    if summary.failed or summary.left_failed:
        raise Exit(code=1)


def _statuses(text: str) -> frozenset[int]:
    statuses = set()
    for item in str(text or "").replace(" ", "").split(","):
        if not item:
            continue
        if not item.isdigit() or not 400 <= int(item) <= 599:
            raise Exit(
                f"error: --retry-status: {item!r} is not an HTTP error status (400-599); "
                "expected a comma-separated list such as 401,422",
                code=2,
            )
        statuses.add(int(item))
    return frozenset(statuses)


def _lines(numbers: list[int], most: int = 12) -> str:
    shown = ", ".join(str(n) for n in numbers[:most])
    return shown + (f", … ({len(numbers) - most} more)" if len(numbers) > most else "")


def _batch_table(title: str, summary: batches.Summary) -> Table:
    """Every outcome of a run in one table: done, failed by reason with their lines, malformed by line."""
    rows = [
        ("input lines", f"{summary.lines:,}", ""),
        ("skipped: done in an earlier run", f"{summary.already_done:,}", ""),
        ("succeeded", f"{summary.succeeded:,}", ""),
    ]
    for reason, lines in sorted(summary.failures.items()):
        rows.append((f"failed: {reason}", f"{len(lines):,}", f"lines {_lines(lines)}"))
    for reason, lines in sorted(summary.not_retried.items()):
        fix = (
            "--retry-failed resends them"
            if reason in summary.resendable
            else f"--retry-status {reason.removeprefix('HTTP ')} resends them once the cause is fixed"
        )
        rows.append(
            (f"failed earlier, not resent: {reason}", f"{len(lines):,}", f"lines {_lines(lines)}; {fix}")
        )
    if summary.bad_lines:
        rows.append(
            ("malformed", f"{summary.malformed:,}", f"lines {_lines([b.line for b in summary.bad_lines])}")
        )
    rows += [
        ("retries within this run", f"{summary.retries:,}", ""),
        ("prompt / completion tokens", f"{summary.prompt_tokens:,} / {summary.completion_tokens:,}", ""),
        ("duration", f"{summary.duration_s:,.1f} s", ""),
    ]
    return tables.table(title, ("", "value", "lines"), rows, numeric=(1,))


@task(name="publish", help={"stack": STACK})
@reports_errors
def gateway_publish(c, stack=None):
    """Upload gateway.yaml (replicas found on EC2 by tag) and the gateway wheels for its hosts to boot from."""
    import tempfile

    from frontier.access import gateway as gateway_files

    settings = settings_for(stack)
    text = gateway_files.render_gateway_config(settings, None)
    store = backend_for(settings).history_store()
    with tempfile.TemporaryDirectory() as tmp:
        wheels = gateway_files.build_gateway_wheels(Path(tmp))
        uris = gateway_files.publish(store.s3, store.bucket, store.artifacts_prefix, text, wheels)
    for uri in uris:
        print(f"published {uri}")


@task(
    name="roll",
    help={
        "stack": STACK,
        "timeout": "seconds to wait for every gateway host to be replaced (default 3600)",
    },
)
@reports_errors
def gateway_roll(c, stack=None, timeout=3600):
    """Replace every gateway host (they boot what `fab gateway.publish` uploaded), keeping the desired
    count healthy throughout, and wait until done."""
    settings = settings_for(stack)
    timeout_s = float(timeout)
    if not 0 < timeout_s <= 86400:
        raise Exit(f"error: --timeout {timeout}: must be seconds in (0, 86400]", code=2)
    backend = backend_for(settings)
    roll = getattr(backend, "roll_gateway", None)  # the targets whose gateway runs on its own hosts
    if roll is None:
        raise Exit(
            f"error: stack {settings.stack!r} (target {settings.target}) has no gateway hosts to roll", code=2
        )

    def report(progress) -> None:  # noqa: ANN001 - frontier.targets.ec2.gateway.RefreshProgress
        reason = f"  {progress.reason}" if progress.reason else ""
        print(
            f"gateway refresh {progress.refresh_id}: {progress.status} {progress.percent}% "
            f"({progress.to_update} to replace){reason}",
            flush=True,
        )

    roll(report, timeout_s=timeout_s)
    print(f"gateway of stack {settings.stack}: every host replaced")


def register(namespace: Collection) -> None:
    namespace.add_task(usage)
    namespace.add_task(batch)
    namespace.add_collection(Collection("gateway", gateway_publish, gateway_roll))
