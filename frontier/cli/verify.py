"""``fab verify``: the stack's verification set against its endpoint (or any other), as a table
per case kind and a pass rate held to ``verify.min_pass_rate``; ``--record`` keeps the golden
outputs in the stack's history beside the release they came from."""

from __future__ import annotations

import os

from invoke import Collection, task
from invoke.exceptions import Exit

from frontier.cli import tables
from frontier.cli.common import pool_settings, reports_errors, settings_for
from frontier.config.load import chosen_pool
from frontier.errors import FrontierError
from frontier.release.history import HistoryStore
from frontier.rollout.recordings import load_for_stack, store_recording
from frontier.targets import backend_for
from frontier.verify import kind_tables, read_set, record_golden, run_set, set_file, summary_table

STACK = "stack name (default $FRONTIER_STACK, else local)"


@task(
    help={
        "stack": STACK,
        "url": "the endpoint to verify (default: the stack's endpoint); one host, a balancer, any OpenAI-compatible API",
        "key": "API key (default $FRONTIER_API_KEY, else the stack's own where it can tell one)",
        "record": "first record the golden cases' greedy outputs from this endpoint as the reference, in the stack's history",
        "release": "with --record: the release the endpoint serves (default: the stack's last good deploy)",
        "model": "the model pool to verify, on a stack serving several (default: the first)",
    }
)
@reports_errors
def verify(c, stack=None, url=None, key=None, record=False, release=None, model=None):
    """Run the stack's verification set; exit 1 when the pass rate is under verify.min_pass_rate.

    Golden cases are held to the outputs last recorded with --record, kept in the stack's history
    beside the release they came from; before any recording they are reported as not yet recorded
    and left out of the pass rate."""
    settings = settings_for(stack)
    # The pool verified (the stack's one, or --model's): its model, and its history's recordings.
    view = pool_settings(stack, model)
    served = chosen_pool(settings, model).model
    set_path = set_file(settings.verify.file)
    # The whole set is checked before anything is sent or read from the history.
    read_set(set_path, model=served.name, golden=None)
    store = backend_for(view).history_store()
    # Another endpoint (--url) needs nothing of the stack's target: no outputs, no key lookup.
    endpoint = url or backend_for(settings).endpoint()
    api_key = key or os.environ.get("FRONTIER_API_KEY") or (None if url else backend_for(settings).api_key())
    console = tables.console()
    if record:
        reference = release or _last_good_release(store, settings.stack)
        blank = read_set(set_path, model=served.name, golden=None)
        outputs = record_golden(endpoint, api_key, blank, model=served.name)
        written = store_recording(store, set_path, model=served.name, release=reference, outputs=outputs)
        console.print(f"recorded {len(outputs)} golden output(s) of release {reference} to {written}")
    verify_set = load_for_stack(store, set_path, model=served.name)
    report = run_set(endpoint, api_key, verify_set, model=served.name, context_tokens=served.max_seq_len)
    for table in kind_tables(report):
        console.print(table)
    console.print(summary_table(report))
    floor = settings.verify.min_pass_rate
    judged = bool(report.ran)
    verdict = "ok" if report.pass_rate >= floor else "UNDER THE THRESHOLD"
    if not judged:
        verdict = "NOTHING RAN"
    print(
        f"verify: cases={len(report.results)} passed={report.passed} failed={len(report.failures)} "
        f"not_recorded={len(report.unrecorded)} pass_rate={report.pass_rate:.3f} "
        f"min_pass_rate={floor:.3f} {verdict}"
    )
    if report.unrecorded:
        names = ", ".join(r.name for r in report.unrecorded)
        print(
            f"verify: {len(report.unrecorded)} golden case(s) not yet recorded ({names}) — run "
            f"`fab verify -s {settings.stack} --record` against the release to hold later ones to"
        )
    if not judged or report.pass_rate < floor:
        raise Exit(code=1)


def _last_good_release(store: HistoryStore, stack: str) -> str:
    record = store.last_good()
    if record is None or not record.get("release"):
        raise FrontierError(
            f"stack {stack!r} has no successful deploy to name as the reference: "
            "give the release the endpoint serves with --release"
        )
    return str(record["release"])


def register(namespace: Collection) -> None:
    namespace.add_task(verify)
