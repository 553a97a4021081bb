"""The access layer's tasks: ``usage`` (metering sums with cost) and ``batch`` (an OpenAI Batch file
through the gateway at batch priority, resumable)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from invoke import Collection, task
from invoke.exceptions import Exit
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

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
        "url": "the gateway's address (default: the stack's endpoint)",
        "concurrency": "requests in flight at once (default 8)",
    }
)
@reports_errors
def batch(c, stack=None, model=None, input=None, output=None, url=None, concurrency=8):  # noqa: A002
    """Run a Batch file through the gateway at batch priority; resumable, one result per line."""
    if not (model and input and output):
        raise Exit("error: --model, --input and --output are required", code=2)
    settings = settings_for(stack)
    try:
        settings.pool(model)
    except KeyError as exc:
        raise Exit(f"error: --model: {exc.args[0]}", code=2) from None
    if int(concurrency) < 1:
        raise Exit(f"error: --concurrency must be >= 1, got {concurrency}", code=2)
    backend = backend_for(settings)
    url = url or backend.endpoint()
    api_key = os.environ.get("FRONTIER_API_KEY") or backend.api_key()
    requests, bad, lines = batches.read_input(Path(input), model)
    results = batches.ResultFile(Path(output))
    console = tables.console()
    for item in bad:
        console.print(f"[yellow]malformed[/] {item.message}")
    done_before = len(results.done)
    progress = Progress(
        TextColumn(f"batch {model}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=console,
    )
    with progress:
        bar = progress.add_task("batch", total=lines, completed=done_before, status="")
        counts = {"ok": 0, "failed": 0}

        def on_result(result: dict) -> None:
            response = result.get("response") or {}
            counts["ok" if response.get("status_code") == 200 else "failed"] += 1
            progress.update(bar, advance=1, status=f"ok {counts['ok']} failed {counts['failed']}")

        try:
            summary = asyncio.run(
                batches.run_batch(
                    url, api_key, requests, bad, results, concurrency=int(concurrency), on_result=on_result
                )
            )
        finally:
            results.close()
    rows = [
        ("input lines", f"{lines:,}"),
        ("already done (resumed)", f"{summary.already_done:,}"),
        ("succeeded", f"{summary.succeeded:,}"),
        (
            "failed",
            f"{summary.failed:,}" + (f" ({dict(summary.statuses - {200: 0})})" if summary.failed else ""),
        ),
        ("malformed lines", f"{summary.malformed:,}"),
        ("retries (429/5xx)", f"{summary.retries:,}"),
        ("prompt / completion tokens", f"{summary.prompt_tokens:,} / {summary.completion_tokens:,}"),
        ("duration", f"{summary.duration_s:,.1f} s"),
    ]
    console.print(tables.table(f"batch {input} -> {output}", ("", "value"), rows, numeric=(1,)))
    print(
        f"batch: lines={lines} done_before={summary.already_done} succeeded={summary.succeeded} "
        f"failed={summary.failed} malformed={summary.malformed} results={len(results.done)}"
    )
    if summary.failed:
        raise Exit(code=1)


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


def register(namespace: Collection) -> None:
    namespace.add_task(usage)
    namespace.add_task(batch)
    namespace.add_collection(Collection("gateway", gateway_publish))
