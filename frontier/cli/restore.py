"""``fab restore``: bring a stack's deploy history back from its bucket's object versions or from
its backup copy in a second region (:mod:`frontier.release.restore`)."""

from __future__ import annotations

from invoke import Collection, task

from frontier.cli import tables
from frontier.cli.common import reports_errors, settings_for
from frontier.figures import size
from frontier.release.history import HistoryStore
from frontier.release.restore import (
    history_source,
    metering_target,
    parse_at,
    restore,
    restore_metering,
    source_of,
)
from frontier.targets import backend_for

STACK = "stack name (default $FRONTIER_STACK, else local)"


@task(
    name="restore",
    help={
        "stack": STACK,
        "from_": "version: the history bucket's object versions (default); backup: the copy in backup.region",
        "at": "restore each key as it was at this time (ISO 8601, UTC unless it names a zone); default: its newest",
        "force": "also replace keys that exist now (a key written after --at included); default: keep them",
        "metering": (
            "restore the gateway's metering records (gateway.metering.uri in S3) instead of the history; "
            "needs credentials that may write there, which the deploy role's may not"
        ),
    },
)
@reports_errors
def restore_history(c, stack=None, from_="version", at=None, force=False, metering=False):
    """Restore the stack's history (releases, records, artifacts), or its metering, from S3 versions or the backup copy."""
    settings = settings_for(stack)
    moment = parse_at(at) if at else None
    pool_store = backend_for(settings).history_store()
    if metering:
        target = metering_target(settings, pool_store.s3)
        source = source_of(settings, target, from_)
        rows = restore_metering(target, source, at=moment, force=bool(force))
    else:
        # The stack's whole prefix: every pool's releases and records, and the artifacts they share.
        store = HistoryStore(pool_store.s3, pool_store.bucket, settings.stack, pool_store.artifacts_prefix)
        source = history_source(settings, store, from_)
        rows = restore(store, source, at=moment, force=bool(force))
    cells = [
        (r.key, r.outcome, r.version_id[:16], r.modified.strftime("%Y-%m-%d %H:%M:%S"), size(r.size))
        for r in rows
    ]
    title = f"restore of stack {settings.stack} from {source.describe()}"
    columns = ("key", "outcome", "version", "written (UTC)", "size")
    tables.console().print(tables.table(title, columns, cells, numeric=(4,)))
    counts = {o: sum(r.outcome == o for r in rows) for o in ("restored", "replaced", "present", "newer")}
    print(", ".join(f"{n} {o}" for o, n in counts.items()))
    if counts["newer"]:
        print("keys written after the restore point were kept: --force replaces them")
    if not counts["restored"] and not counts["replaced"]:
        print("nothing to do: every key the source holds is in the history")


def register(namespace: Collection) -> None:
    namespace.add_task(restore_history)
