"""Operate a stack: ``deploy``, ``rollback``, ``status``, ``history``, ``drivers``, ``unlock``,
``weights.push``, ``weights.gc``, ``release.build``, ``image.build`` and ``image.push``."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from invoke import Collection, task
from invoke.exceptions import Exit
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from frontier.cli import tables
from frontier.cli.common import pool_settings, reports_errors, settings_for
from frontier.config.load import chosen_pool
from frontier.config.purchase import has_notice_queue
from frontier.config.schema import Settings
from frontier.figures import size
from frontier.hosts import drivers as nvidia
from frontier.hosts.boots import boot_records
from frontier.hosts.notices import pending_notices
from frontier.release import artifact as artifacts
from frontier.release import sbom as supply_chain
from frontier.release import weights as model_weights
from frontier.release.shape import check_checkpoint
from frontier.rollout.deploy import deploy as run_deploy
from frontier.rollout.deploy import deploy_plan
from frontier.rollout.deploy import rollback as run_rollback
from frontier.rollout.rolling import Event, RolloutFailed, RolloutResult
from frontier.targets import backend_for

STACK = "stack name (default $FRONTIER_STACK, else local)"
_COLOUR = {"ok": "green", "fail": "red", "info": "cyan", "start": "dim"}


def _reporter(console):
    started = time.monotonic()

    def report(event: Event) -> None:
        if event.status == "start":
            return
        status = f"[{_COLOUR[event.status]}]{event.status:4}[/]"
        took = f"{event.elapsed_s:6.2f}s" if event.status in ("ok", "fail") else " " * 7
        detail = event.detail.splitlines()[0][:100] if event.detail else ""
        console.print(
            f"{time.monotonic() - started:7.1f}s  {event.host:14} {event.phase:10} {status} {took}  {detail}"
        )

    return report


def _summary(console, result: RolloutResult) -> None:
    rows = [
        (h.name, h.from_release or "-", h.to_release, h.outcome, f"{h.out_of_service_s:.1f}s", h.error[:70])
        for h in result.hosts
    ]
    title = f"{result.kind} {result.release}: {result.outcome} in {result.duration_s:.1f}s"
    console.print(tables.table(title, ("host", "from", "to", "outcome", "out of service", "error"), rows))
    if result.strategy:
        console.print(f"capacity: {result.strategy}")
    if result.steps:
        console.print(_steps_table(f"{result.kind} {result.release}", [s.to_record() for s in result.steps]))


def _steps_table(title: str, steps: list[dict[str, Any]]):
    """A rollout by traffic share, step by step: the share, the verdict, both releases' series."""
    rows = [
        (
            _share(s),
            s["outcome"],
            str(s["routable"]),
            s["new"][:60],
            s["old"][:60],
            s["reason"][:80],
        )
        for s in steps
    ]
    columns = ("traffic", "outcome", "routable", "new release", "old release", "reason")
    return tables.table(f"traffic steps of {title}", columns, rows)


def _share(step: dict[str, Any]) -> str:
    """The share a step asked, and beside it the one realised where the target rounds it to replicas."""
    realised = step.get("realised")
    if realised is None or round(realised) == step["percent"]:
        return f"{step['percent']} %"
    return f"{step['percent']} % ({realised:.0f} % realised)"


def _roll(fn, console) -> None:
    try:
        result = fn(_reporter(console))
    except RolloutFailed as exc:
        _summary(console, exc.result)
        raise Exit(f"error: {exc}", code=1) from None
    _summary(console, result)


@task(
    help={
        "stack": STACK,
        "digest": "runtime artifact digest, sha256:<64 hex> (tags are refused)",
        "plan": "only show what would happen, host by host; change nothing",
        "model": "the model pool to roll (a stack of several models needs it); the others are untouched",
    }
)
@reports_errors
def deploy(c, stack=None, digest=None, plan=False, model=None):
    """Roll a runtime digest over the stack: canary, batches, drain, readiness, gate, auto-rollback."""
    if not digest:
        raise Exit("error: --digest sha256:<64 hex> is required (fab release.build prints it)", code=2)
    settings = pool_settings(stack, model)
    console = tables.console()
    backend = backend_for(settings)
    if plan:
        release, rows = deploy_plan(backend, digest)
        title = (
            f"plan: deploy {release.id} (digest {release.digest[:19]}…, config {release.config_hash[:19]}…)"
        )
        cells = [(p.wave, p.host, p.current, p.target, p.action) for p in rows]
        console.print(tables.table(title, ("wave", "host", "runs now", "target", "action"), cells))
        return
    _roll(lambda report: run_deploy(backend, digest, reporter=report), console)


@task(
    help={
        "stack": STACK,
        "to": "release id to roll back to (default: the previous good release)",
        "model": "the model pool to roll back (a stack of several models needs it)",
    }
)
@reports_errors
def rollback(c, stack=None, to=None, model=None):
    """Roll the previous good release (or --to) through the same path; no rebuild, no re-render."""
    settings = pool_settings(stack, model)
    console = tables.console()
    _roll(lambda report: run_rollback(backend_for(settings), to, reporter=report), console)


@task(help={"stack": STACK})
@reports_errors
def status(c, stack=None):
    """What each host runs, and whether it is ready."""
    settings = settings_for(stack)
    backend = backend_for(settings)
    rows = []
    for host in backend.hosts():
        try:
            session = backend.session(host)
            try:
                f = session.status()
            finally:
                session.close()
            restarts = f"{f.restarts} ({f.last_restart[:40]})" if f.restarts else "0"
            rows.append(
                (host.name, host.address, f.current or "-", f.digest[:19] or "-", f.previous or "-",
                 "yes" if f.running else "no", "yes" if f.ready else "no", "yes" if f.live else "no", restarts)
            )  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - one unreachable host is a row, not the end of the table
            rows.append((host.name, host.address, "?", "?", "?", "?", "?", f"unreachable: {exc}"[:60], "?"))
    store = backend.history_store()
    lock = store.read_lock()
    console = tables.console()
    columns = ("host", "address", "release", "digest", "previous", "running", "ready", "live", "restarts")
    console.print(tables.table(f"stack {settings.stack}", columns, rows))
    console.print(f"deploy lock: {lock.describe() if lock else 'free'}")
    if lock is not None and lock.lapsed():
        console.print(
            "  lapsed (its holder stopped renewing it, or ran past its horizon): the next deploy takes it over"
        )
    _print_notices(console, backend, settings)


def _print_notices(console: Any, backend: Any, settings: Settings) -> None:
    """Spot, rebalance and Capacity Block notices waiting on the stack's queue (read, not consumed)."""
    if not has_notice_queue(settings.node_groups):
        return  # every group buys on-demand: no queue, and the deploy role may read none
    stack = settings.stack
    try:
        notices = pending_notices(backend.aws_client("sqs"), stack)
    except Exception as exc:  # noqa: BLE001 - the host table above stands; say why this part is missing
        console.print(f"interruption notices: unreadable ({exc})"[:200])
        return
    if notices is None:
        return  # the stack buys on-demand only: no queue
    if not notices:
        console.print("interruption notices: none waiting")
        return
    columns = ("sent (UTC)", "notice", "instance or block", "action")
    console.print(tables.table("interruption notices waiting", columns, [n.row() for n in notices]))


@task(help={"stack": STACK, "limit": "show the last N entries (default 20)"})
@reports_errors
def history(c, stack=None, limit=20):
    """Every deploy and rollback of the stack: who, when, what, outcome and why."""
    settings = settings_for(stack)
    store = backend_for(settings).history_store()
    records = store.records()[-int(limit) :]
    rows = [
        (r["started_at"][:19].replace("T", " "), r["kind"], r["release"], r["digest"][:19], r["config_hash"][:19],
         r["who"], f"{r['duration_s']:.1f}s", r["outcome"], r.get("reason", "")[:60],
         # SBOM components and the audit (frontier.release.sbom); "-" for a record from before them.
         "-" if r.get("sbom_components") is None else str(r["sbom_components"]), r.get("audit", "-")[:60])
        for r in records
    ]  # fmt: skip
    columns = (
        "started (UTC)", "kind", "release", "digest", "config", "who", "took", "outcome", "reason", "sbom", "audit"
    )  # fmt: skip
    console = tables.console()
    console.print(tables.table(f"history of stack {settings.stack}", columns, rows))
    if records and records[-1].get("strategy"):
        console.print(f"last {records[-1]['kind']} kept capacity by {records[-1]['strategy']}")
    if records and records[-1].get("steps"):
        console.print(_steps_table(f"the last {records[-1]['kind']}", records[-1]["steps"]))
    boots = boot_records(store, int(limit))
    if boots:
        boot_rows = [(b.at, b.host, b.node_group, b.release or "-", b.outcome, b.reason[:70]) for b in boots]
        boot_columns = ("booted (UTC)", "host", "group", "release", "outcome", "reason")
        console.print(tables.table(f"host boots of stack {settings.stack}", boot_columns, boot_rows))


@task(help={"stack": STACK})
@reports_errors
def unlock(c, stack=None):
    """Break the stack's deploy lock (after a deploy died); prints who held it."""
    settings = settings_for(stack)
    held = backend_for(settings).history_store().break_lock()
    print(f"removed the deploy lock held by {held.describe()}" if held else "the deploy lock was free")
    if held is not None and held.lease_until and not held.lapsed():
        # A live lease means its deploy is still running: it learns at its next renewal.
        print("its lease was still being renewed: that deploy stops before its next host step")


@task(help={"stack": STACK})
@reports_errors
def drivers(c, stack=None):
    """Check the NVIDIA driver on GPU hosts: trust the AMI's, install the pinned one on plain Ubuntu; never reboots."""
    settings = settings_for(stack)
    backend = backend_for(settings)
    results = nvidia.run(settings, backend.hosts(), backend.connect)
    rows = [
        (r.host, "ok" if r.ok else "FAILED", "changed" if r.changed else "nothing changed",
         "REBOOT REQUIRED" if r.reboot_required else "no", r.gpus, r.driver, r.toolkit, r.error[:60])
        for r in results
    ]  # fmt: skip
    columns = ("host", "result", "changes", "reboot", "gpus", "driver", "toolkit", "error")
    tables.console().print(tables.table(f"NVIDIA drivers on stack {settings.stack}", columns, rows))
    reboot = [r.host for r in results if r.reboot_required]
    if reboot:
        print(f"not rebooted (do it in a maintenance window): {', '.join(reboot)}")
    if not all(r.ok for r in results):
        raise Exit(
            "error: the driver script failed on " + ", ".join(r.host for r in results if not r.ok), code=1
        )


# --- weights, release, image ----------------------------------------------------------------------


@task(
    name="push",
    help={
        "stack": STACK,
        "src": "model directory to upload",
        "version": "weights version (default: model.version)",
        "model": "the model pool whose weights these are (a stack of several models needs it)",
    },
)
@reports_errors
def weights_push(c, stack=None, src=None, version=None, model=None):
    """Upload a model directory to the pool's weights location with a sha256 manifest (written last)."""
    if not src:
        raise Exit("error: --src DIR is required (the model directory to upload)", code=2)
    settings = settings_for(stack)
    backend = backend_for(settings)
    served = chosen_pool(settings, model).model
    version = version or served.version
    if Path(src).is_dir():
        # Before any byte is sent: the plan and the memory fit were made for the stack's shape.
        check_checkpoint(served, Path(src))
    files = [p for p in Path(src).rglob("*") if p.is_file()] if Path(src).is_dir() else []
    total = sum(p.stat().st_size for p in files)
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
    with Progress(*columns, console=tables.console(), transient=True) as bar:
        job = bar.add_task(f"weights {served.name}@{version}", total=total)
        report = model_weights.push(
            backend.aws_client("s3"), Path(src), served.weights_uri, served.name, version,
            progress=lambda _path, sent: bar.advance(job, sent), create_bucket=backend.creates_buckets,
        )  # fmt: skip
    print(
        f"{report.uri}: uploaded {len(report.uploaded)} file(s) ({report.bytes_uploaded:,} bytes), "
        f"skipped {len(report.skipped)} identical; manifest "
        + ("written" if report.manifest_written else "already in place")
    )


@task(
    name="gc",
    iterable=["version"],
    help={
        "stack": STACK,
        "model": "the model pool whose weights to clean (a stack of several models needs it)",
        "keep_last": "keep this many most recently pushed versions too (default: rollout.keep_weight_versions)",
        "dry_run": "only print what would be deleted and why; delete nothing",
        "version": "delete only this version (repeatable); refused if a kept release needs it",
    },
)
@reports_errors
def weights_gc(c, stack=None, model=None, keep_last=None, dry_run=False, version=None):
    """Delete the weights versions no kept release needs, beyond the last N pushed; --dry-run shows the table."""
    view = pool_settings(stack, model)  # the pool's history: the releases it keeps
    weights_uri = chosen_pool(view, model).model.weights_uri
    backend = backend_for(view)
    s3 = backend.aws_client("s3")
    kept = model_weights.kept_releases(backend.history_store(), view.rollout.keep_releases)
    last = view.rollout.keep_weight_versions if keep_last is None else int(keep_last)
    plan = model_weights.plan_gc(s3, weights_uri, kept, last, version or ())
    verb = "would delete" if dry_run else "delete"
    rows = [
        (v.version, "keep" if v.keep else verb, v.stored.pushed_at or "-", len(v.stored.keys),
         size(v.stored.bytes), v.why)
        for v in plan.verdicts
    ]  # fmt: skip
    title = f"weights gc: {weights_uri} (kept releases: {', '.join(r.release_id for r in kept) or 'none'})"
    console = tables.console()
    console.print(
        tables.table(title, ("version", "action", "pushed", "objects", "bytes", "why"), rows, numeric=(3, 4))
    )
    doomed = plan.doomed
    freed = size(sum(v.stored.bytes for v in doomed))
    if dry_run:
        print(f"dry run: {len(doomed)} version(s) ({freed}) would be deleted; nothing was")
        return
    deleted = model_weights.apply_gc(s3, plan)
    print(f"deleted {len(deleted)} version(s) ({freed}): {', '.join(deleted) or 'none'}")


@task(name="build", help={"stack": STACK})
@reports_errors
def release_build(c, stack=None):
    """Build the runtime wheel reproducibly, make its SBOM and audit, and register its digest (where
    no container engine runs); the stack's releases.refuse_vulnerabilities_at may refuse it."""
    settings = settings_for(stack)
    built, path = artifacts.build_wheel()
    threshold = settings.releases.refuse_vulnerabilities_at
    built, sbom, audit = supply_chain.survey(built, threshold, settings.stack)
    store = backend_for(settings).history_store()
    store.put_artifact(built, path)
    supply_chain.put_supply_chain(store, built, sbom, audit)
    print(f"built {path.name} ({built.size:,} bytes)\ndigest: {built.digest}")
    print(f"sbom: {sbom.components} components, CycloneDX {sbom.digest}")
    print(audit.summary())
    print(f"deploy it with: fab deploy -s {settings.stack} --digest {built.digest}")


@task(
    name="build",
    help={"stack": STACK, "tag": "local tag for the image (default: src-<hash of the runtime sources>)"},
)
@reports_errors
def image_build(c, stack=None, tag=None):
    """docker build the runtime image (needs a container engine)."""
    settings = settings_for(stack)
    tag = tag or artifacts.source_tag()
    image_id = artifacts.build_image(settings.image_repository, tag)
    print(f"built {settings.image_repository}:{tag} ({image_id}); push it with fab image.push")


@task(name="push", help={"stack": STACK, "tag": "tag to push (default: src-<hash of the runtime sources>)"})
@reports_errors
def image_push(c, stack=None, tag=None):
    """Push the runtime image to ECR and register the digest ECR returns (needs a container engine)."""
    settings = settings_for(stack)
    artifacts.container_engine()
    tag = tag or artifacts.source_tag()
    backend = backend_for(settings)
    built = artifacts.push_image(settings.image_repository, tag, backend.aws_client("ecr"))
    backend.history_store().put_artifact(built, None)
    print(f"pushed {built.image}\ndeploy it with: fab deploy -s {settings.stack} --digest {built.digest}")


@task(
    help={"stack": STACK, "replicas": "hosts the serving node group should run (within min_size..max_size)"}
)
@reports_errors
def scale(c, stack=None, replicas=None):
    """Set the serving group's desired capacity by hand; the scaling policy takes over from there."""
    if replicas is None:
        raise Exit("error: --replicas N is required", code=2)
    settings = settings_for(stack)
    fleet = backend_for(settings).fleet()
    if fleet is None:
        raise Exit(
            f"error: stack {settings.stack!r} has a fixed set of hosts (inventory.source = "
            f"{settings.inventory.source!r}); only an auto scaling group can be scaled",
            code=2,
        )
    before = fleet.size()
    after = fleet.scale(int(replicas))
    tables.console().print(
        f"{fleet.name}: desired {before.desired} -> {after.desired} (min {after.min_size}, max {after.max_size})"
    )


def register(namespace: Collection) -> None:
    for t in (deploy, rollback, status, history, drivers, unlock, scale):
        namespace.add_task(t)
    namespace.add_collection(Collection("weights", weights_push, weights_gc))
    namespace.add_collection(Collection("release", release_build))
    namespace.add_collection(Collection("image", image_build, image_push))
