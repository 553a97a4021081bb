"""``make demo``: the whole loop on the embedded local stack, with no cloud and no GPU.

    python -m frontier.demo [--stack local] [--rate R] [--keep-up]

1. generate the tiny randomly initialised Llama model (``python -m frontier_runtime.tiny``);
2. ``local.up``: moto enforcing IAM (``fab``, the host slots and the gateway each sign as a user
   whose policies are the cloud roles' documents), the host slots over SSH, HAProxy;
3. ``weights.push`` the model to the stack's weights bucket (in moto), with its sha256 manifest;
4. ``release.build``: the runtime wheel and its sha256 digest, registered in the history bucket;
5. ``deploy`` release **A** (the stack file as it is) over every host: canary, drain, gate;
6. a few requests through HAProxy with the official ``openai`` client (completion, chat, streaming);
7. a short load test (Poisson arrivals at ``--rate``);
8. ``deploy`` release **B** under a steady load. B is the same runtime digest with one batching
   change, so only its rendered ``runtime.yaml`` differs: ``runtime.batch.max_batch_size`` halved
   and ``runtime.batch.window_ms`` raised to 10 ms — a latency-leaning batching setting, the kind
   of change an operator rolls and may want back. It is written as a copy of the stack file with
   that one change (``<state_dir>/demo/Pulumi.local.yaml``) and loaded by the same loader;
9. ``rollback`` under the same load: back to A, byte for byte, through the same gates;
10. a release that serves but answers wrongly: release A's greedy outputs recorded as the golden
    cases of ``stacks/verify/canary.yaml``, then release **C**, A with ``kv_cache_dtype: fp8`` and
    ``rollout.verify_canary: true``, deployed under load: its canary passes readiness and the metric
    gate, fails the verification set and is rolled back; ``fab history`` names the failed cases
    (``frontier/demo/canary.py``);
11. self-healing under a steady load of non-streamed requests: ``kill -9`` of host-2's runtime;
    its supervisor relaunches it and HAProxy puts it back, timed (no request fails: HAProxy retries
    the ones the killed runtime was answering on another host);
12. a launch: the spare slot (host-4) boots the current release by itself from the history —
    the same ``bootstrap.py boot`` cloud-init runs on an EC2 host — and joins HAProxy; then it is
    retired, drained first (what ``fab local.autoscale`` does on queue depth);
13. two models behind the gateway: the stack file as two pools (the tiny model on every slot but
    the last, a smaller model of another shape on the last), each rolled with ``deploy --model``,
    the gateway started in front with two tenants — ``acme`` (interactive, both models) streams
    chats to each model, ``nightly`` (batch, the small model only) streams four of its own, is
    refused the other model (404) and runs a 16-line batch job — then the gateway's metering
    summed per tenant and model;
13a. migration (``frontier/demo/migration.py``): one long greedy stream to the first model whose
    replica gets a notice mid-stream (the gateway's ``/admin/replicas/interrupt``); it carries on at
    the other replica with no error, and the migration count, the stall and the text's equality
    with the uninterrupted run are printed;
13b. scale from zero (``frontier/demo/zero.py``): the small model's pool retired to zero, eight
    requests for it sent at once and held by the gateway, the local autoscaler launches its slot
    (a boot from the pool's own history under the host role's policy), every request answered,
    the first one's time to first token printed, then the pool back at zero once idle (and its
    slot restored);
14. a closing table and the usage table, then exactly one last line:
    ``demo: sent=<n> failed=<n> deploy_s=<s> rollback_s=<s>``.

It exits non-zero when any request failed or any step failed (an AWS call an actor's policy does
not allow is one line naming the call and moto's words, which name the action). The stack is taken down at the end
(``local.down``) unless ``--keep-up`` is given, which leaves it running for ``fab status``,
``fab history``, ``fab loadtest`` and HAProxy's stats page.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from botocore.exceptions import ClientError
from rich.table import Table

from frontier.config.load import chosen_pool, stack_path
from frontier.config.schema import Model, PoolSettings, Settings
from frontier.demo.canary import wrong_answers_rolled_back
from frontier.demo.variants import load_variant, stack_document
from frontier.errors import FrontierError
from frontier.loadtest.client import BackgroundLoad, Target, run_steps
from frontier.loadtest.report import step_notes, steps_table, wide_console
from frontier.loadtest.stats import Distribution, RequestSample, SloTargets, summarize
from frontier.rollout.deploy import deploy, rollback
from frontier.targets import backend_for, load_stack
from frontier.targets.local import cluster as local
from frontier.targets.local.iam import refusal

console = wide_console()


@dataclass
class Tally:
    """What the last line reports; filled in as the demo goes, so a failed demo still reports it."""

    sent: int = 0
    failed: int = 0
    deploy_s: float = 0.0
    rollback_s: float = 0.0

    def add(self, samples: list[RequestSample]) -> None:
        self.sent += len(samples)
        self.failed += sum(1 for s in samples if not s.ok)

    def line(self) -> str:
        return f"demo: sent={self.sent} failed={self.failed} deploy_s={self.deploy_s:.1f} rollback_s={self.rollback_s:.1f}"


@dataclass
class Phase:
    """Requests of one part of the demo, for the closing table."""

    name: str
    samples: list[RequestSample]
    duration_s: float | None = None

    @property
    def failed(self) -> int:
        return sum(1 for s in self.samples if not s.ok)


def step(title: str) -> None:
    console.rule(f"[bold]{title}")


# --- the model, the stack, the artifact -----------------------------------------------------------


def tiny_model(settings: Settings, model: Model) -> Path:
    out = local.state_dir(settings) / "model" / model.name
    if (out / "config.json").exists():
        console.print(f"tiny model already generated: {out}")
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "frontier_runtime.tiny", "--out", str(out)]
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise FrontierError(f"generating the tiny model failed:\n{(result.stderr or result.stdout)[-2000:]}")
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    console.print(f"tiny model: {out} ({size / 1e6:.1f} MB, {time.perf_counter() - started:.1f}s)")
    return out


def bring_up(settings: Settings) -> None:
    for component in local.up(settings):
        console.print(f"  {component.name:<16} {component.state:<8} {component.detail}")


def push_weights(settings: Settings, model: Model, model_dir: Path) -> None:
    from frontier.release import weights

    report = weights.push(
        local.aws_client(settings, "s3"),
        model_dir,
        model.weights_uri,
        model.name,
        model.version,
    )
    console.print(
        f"weights: {report.uri} — {len(report.uploaded)} uploaded ({report.bytes_uploaded / 1e6:.1f} MB), "
        f"{len(report.skipped)} unchanged"
    )


def build_artifact(settings: Settings) -> str:
    from frontier.release.artifact import build_wheel

    started = time.perf_counter()
    artifact, wheel = build_wheel()
    backend_for(settings).history_store().put_artifact(artifact, wheel)
    console.print(
        f"runtime wheel {artifact.filename}: {artifact.digest} ({time.perf_counter() - started:.1f}s)"
    )
    return artifact.digest


def variant_b(settings: Settings) -> Settings:
    """Release B's settings: the stack file with a halved max_batch_size and a 10 ms batch window."""
    document = stack_document(settings)
    batch = document["config"]["frontier:runtime"]["batch"]
    batch["max_batch_size"] = max(1, int(batch["max_batch_size"]) // 2)
    batch["window_ms"] = 10
    return load_variant(
        settings,
        document,
        local.state_dir(settings) / "demo" / Path(settings.source).name,
        "Release B of the demo: the stack file with one batching change (see frontier/demo/run.py).",
    )


# --- rollouts -------------------------------------------------------------------------------------


def _reporter(event) -> None:
    if event.status == "ok" and event.phase in ("drain", "stop", "start", "readiness", "enable", "gate"):
        console.print(
            f"    {event.host:<8} {event.phase:<9} {event.elapsed_s:6.2f}s  [dim]{event.detail[:70]}[/]"
        )
    elif event.status == "info":
        console.print(f"  [cyan]{event.phase}[/] {event.host} [dim]{event.detail}[/]")
    elif event.status == "fail":
        console.print(f"    [red]{event.host} {event.phase} failed: {event.detail[:300]}[/]")


def roll(kind: str, settings: Settings, digest: str | None = None) -> tuple[float, str]:
    """Deploy ``digest`` (or roll back); return the duration and the release now serving."""
    backend = backend_for(settings)
    result = (
        deploy(backend, digest, reporter=_reporter)
        if kind == "deploy"
        else rollback(backend, reporter=_reporter)
    )
    console.print(
        f"  {result.kind} of {result.release}: [green]{result.outcome}[/] in {result.duration_s:.1f}s"
    )
    return result.duration_s, result.release


# --- clients --------------------------------------------------------------------------------------


def openai_requests(model: str, base_url: str, key: str) -> list[RequestSample]:
    """A completion, a chat and a streamed completion of ``model`` through HAProxy with the official client."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0, timeout=30)
    samples = []
    first_chunk: list[float] = []  # when the streamed call saw its first text (TTFT is a streaming figure)

    def timed(label: str, call) -> None:
        """``call`` returns the text and the completion tokens the server counted (its usage)."""
        first_chunk.clear()
        started = time.perf_counter()
        try:
            text, tokens = call()
        except Exception as exc:  # noqa: BLE001 - a failed request is a result of the demo, not a crash
            samples.append(RequestSample(started, False, error=type(exc).__name__))
            console.print(f"  {label}: [red]{type(exc).__name__}: {exc}[/]")
            return
        elapsed = time.perf_counter() - started
        ttft = first_chunk[0] - started if first_chunk else None
        samples.append(RequestSample(started, True, ttft_s=ttft, e2el_s=elapsed, output_tokens=tokens))
        shown = f"{elapsed * 1000:.0f} ms" + (
            f", first token {ttft * 1000:.0f} ms" if ttft is not None else ""
        )
        console.print(f"  {label} ({shown}): {text!r}")

    console.print(f"  models: {[m.id for m in client.models.list().data]}")

    def completion() -> tuple[str, int]:
        reply = client.completions.create(model=model, prompt="The cluster", max_tokens=12, temperature=0)
        return reply.choices[0].text, reply.usage.completion_tokens

    def chat() -> tuple[str, int]:
        reply = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Say hello."}], max_tokens=12, temperature=0
        )
        return reply.choices[0].message.content or "", reply.usage.completion_tokens

    timed("completion", completion)
    timed("chat", chat)

    def streamed() -> tuple[str, int]:
        stream = client.completions.create(
            model=model,
            prompt="Once upon a time",
            max_tokens=16,
            stream=True,
            stream_options={"include_usage": True},
        )
        parts, usage = [], None
        for chunk in stream:
            if chunk.choices and chunk.choices[0].text:
                if not first_chunk:
                    first_chunk.append(time.perf_counter())
                parts.append(chunk.choices[0].text)
            usage = chunk.usage or usage
        if usage is None:
            raise RuntimeError("the stream ended without the usage chunk that include_usage asks for")
        return "".join(parts), usage.completion_tokens

    timed("stream", streamed)
    return samples


def slo_of(settings: Settings) -> SloTargets:
    s = settings.slo
    return SloTargets(
        ttft_ms=s.ttft_ms, tpot_ms=s.tpot_ms, p99_latency_ms=s.p99_latency_ms, error_rate=s.error_rate
    )


def short_load(settings: Settings, target: Target, rate: float, seconds: float) -> list[RequestSample]:
    results = asyncio.run(run_steps(target, [rate], seconds, seed=1))
    samples = list(results[0].samples)
    summary = summarize(samples, window=results[0].window, slo=slo_of(settings), offered_rps=rate)
    console.print(steps_table([summary], slo_of(settings)))
    for note in step_notes([summary], slo_of(settings)):
        console.print(f"  {note}")
    return samples


# --- the closing table ----------------------------------------------------------------------------


def closing_table(phases: list[Phase]) -> Table:
    table = Table(title="demo", title_justify="left")
    for name in (
        "phase",
        "sent",
        "failed",
        "E2EL p50 ms",
        "E2EL p99 ms",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "duration s",
    ):
        table.add_column(name, justify="left" if name == "phase" else "right")
    everything = [s for p in phases for s in p.samples]
    for phase in [*phases, Phase("total", everything)]:
        ok = [s for s in phase.samples if s.ok]
        e2el = Distribution.of_seconds(s.e2el_s for s in ok if s.e2el_s is not None)
        ttft = Distribution.of_seconds(s.ttft_s for s in ok if s.ttft_s is not None)
        table.add_row(
            phase.name,
            str(len(phase.samples)),
            str(phase.failed) if not phase.failed else f"[red]{phase.failed}[/]",
            f"{e2el.p50_ms:,.0f}" if e2el.count else "-",
            f"{e2el.p99_ms:,.0f}" if e2el.count else "-",
            f"{ttft.p50_ms:,.0f}" if ttft.count else "-",
            f"{ttft.p99_ms:,.0f}" if ttft.count else "-",
            f"{phase.duration_s:.1f}" if phase.duration_s is not None else "",
        )
    return table


def _between(samples: list[RequestSample], start: float, end: float) -> list[RequestSample]:
    return [s for s in samples if start <= s.sent_at < end]


def run(settings: Settings, pool: PoolSettings, rate: float, load_s: float, tally: Tally) -> int:
    """The demo on the local stack, which serves one model (``pool``) until its two-model part."""
    phases: list[Phase] = []
    step("1. the tiny model")
    model_dir = tiny_model(settings, pool.model)
    step("2. local.up")
    bring_up(settings)
    step("3. weights.push")
    push_weights(settings, pool.model, model_dir)
    step("4. release.build")
    digest = build_artifact(settings)
    step("5. deploy release A")
    _, release_a = roll("deploy", settings, digest)

    base_url = local.balancer_url(settings)
    key = local.api_key(settings, pool)
    step(f"6. requests through HAProxy ({base_url}) with the openai client")
    phases.append(Phase("openai client", openai_requests(pool.name, base_url, key)))
    tally.add(phases[-1].samples)

    target = Target(
        base_url=base_url,
        model=pool.name,
        api_key=key,
        prompt_tokens=settings.capacity.avg_prompt_tokens,
        max_tokens=settings.capacity.avg_output_tokens,
        timeout_s=30,
    )
    step(f"7. load test: Poisson arrivals at {rate:g} req/s for {load_s:g}s")
    phases.append(Phase("load test", short_load(settings, target, rate, load_s), load_s))
    tally.add(phases[-1].samples)

    settings_b = variant_b(settings)
    b = settings_b.pool(pool.name).runtime.batch
    step(
        f"8. deploy release B (max_batch_size {b.max_batch_size}, window_ms {b.window_ms:g}) under {rate:g} req/s"
    )
    load = BackgroundLoad(target, rate, seed=2).start()
    time.sleep(2.0)  # the load is flowing before the first host drains
    try:
        tally.deploy_s, release_b = roll("deploy", settings_b, digest)
        t1 = time.perf_counter()
        step(f"9. rollback to release A under {rate:g} req/s")
        tally.rollback_s, back_to = roll("rollback", settings)
        t2 = time.perf_counter()
        time.sleep(2.0)
    finally:
        samples = load.stop()
        tally.add(samples)
    if back_to != release_a:
        raise FrontierError(f"rollback landed on {back_to}, expected release A {release_a}")
    phases.append(Phase(f"deploy B {release_b}", _between(samples, 0, t1), tally.deploy_s))
    phases.append(Phase(f"rollback to A {release_a}", _between(samples, t1, t2), tally.rollback_s))
    phases.append(Phase("after rollback", _between(samples, t2, float("inf"))))

    step(
        f"10. release C (kv_cache_dtype fp8), its canary verified against release A's answers, under {rate:g} req/s"
    )
    result, samples, reason = wrong_answers_rolled_back(settings, digest, release_a, target, rate, _reporter)
    tally.add(samples)
    outcome = "[green]rolled back[/]" if result.outcome == "rolled_back" else f"[red]{result.outcome}[/]"
    console.print(f"  deploy of {result.release}: {outcome} in {result.duration_s:.1f}s")
    console.print(f"  fab history: {reason}")
    if result.outcome != "rolled_back" or "verification" not in reason:
        raise FrontierError(
            f"release C's canary was not stopped by its verification: {result.outcome} ({reason})"
        )
    phases.append(Phase(f"wrong answers {result.release}", samples, result.duration_s))

    phases += fleet_part(settings, target, rate, tally)

    step("13. two models, two tenants behind the gateway")
    model_phases, usage = models_part(settings, pool, digest, tally)
    phases += model_phases

    step("14. summary")
    console.print(closing_table(phases))
    console.print(usage)
    if tally.failed:
        kinds: dict[str, int] = {}
        for s in (s for p in phases for s in p.samples if not s.ok):
            kinds[s.error or "unknown"] = kinds.get(s.error or "unknown", 0) + 1
        console.print(f"[red]failed requests by kind: {kinds}[/]")
    console.print(
        f"the same tasks against a cloud stack: fab weights.push / release.build / deploy / rollback / loadtest "
        f"--stack prod (stack file {stack_path('prod').name})"
    )
    return 1 if tally.failed else 0


def fleet_part(settings: Settings, target: Target, rate: float, tally: Tally) -> list[Phase]:
    """A killed runtime heals itself; a spare slot joins by itself, then leaves drained."""
    from frontier.demo.alerts import print_page_messages
    from frontier.targets.local.heal import kill_and_recover

    backend = backend_for(settings)
    fleet = backend.fleet()
    fleet.say = lambda line: console.print(f"  {line}")
    victim = backend.hosts()[1]
    # Non-streamed requests: one the killed runtime was answering is retried by HAProxy on another
    # host (a stream that has begun could not move).
    whole = replace(target, stream=False)
    step(f"11. self-healing: kill -9 the runtime of {victim.name} under {rate:g} req/s")
    load = BackgroundLoad(whole, rate, seed=3).start()
    try:
        time.sleep(2.0)
        killed_at = time.time()
        recovery = kill_and_recover(settings, backend.pool, victim, backend.balancer())
        time.sleep(2.0)
    finally:
        samples = load.stop()
        tally.add(samples)
    console.print(
        f"  {victim.name}: relaunched by its supervisor after {recovery.relaunched_s:.2f}s, ready after "
        f"{recovery.ready_s:.2f}s, back in HAProxy rotation after {recovery.in_rotation_s:.2f}s"
    )
    # The page channel: the runtime-down alarm and its recovery, as the on-call queue received them.
    print_page_messages(settings, victim.name, killed_at, say=console.print)
    phases = [
        Phase(
            f"kill -9 {victim.name}: back in {recovery.in_rotation_s:.1f}s", samples, recovery.in_rotation_s
        )
    ]

    spares = fleet.spares()
    if not spares:
        console.print("  no spare host slot in inventory.hosts: the launch step is skipped")
        return phases
    spare = spares[0]
    step(f"12. a new host slot: {spare.name} boots the current release by itself, joins, then retires")
    load = BackgroundLoad(target, rate, seed=4).start()
    try:
        time.sleep(1.0)
        launched = fleet.launch(spare, settings.rollout.readiness_timeout_s)
        t1 = time.perf_counter()
        time.sleep(3.0)  # it takes its share of the traffic
        t2 = time.perf_counter()
        fleet.retire([spare])
        t3 = time.perf_counter()
        time.sleep(1.0)
    finally:
        samples = load.stop()
        tally.add(samples)
    console.print(
        f"  {spare.name}: booted {launched.release} in {launched.boot_s:.1f}s (bootstrap from the history), "
        f"in HAProxy rotation after {launched.in_rotation_s:.1f}s; retired drained in {t3 - t2:.1f}s"
    )
    return [
        *phases,
        Phase(
            f"launch {spare.name}: joined in {launched.in_rotation_s:.1f}s",
            _between(samples, 0, t1),
            launched.in_rotation_s,
        ),
        Phase(f"{spare.name} serving", _between(samples, t1, t2)),
        Phase(f"retire {spare.name} (drained)", _between(samples, t2, float("inf")), t3 - t2),
    ]


def models_part(
    settings: Settings, pool: PoolSettings, digest: str, tally: Tally
) -> tuple[list[Phase], Table]:
    """A second pool beside ``pool`` (the stack's own), the two rolled one at a time, the gateway in
    front, two tenants' traffic, their usage."""
    from frontier.access.report import usage_table
    from frontier.demo import models as dm
    from frontier.demo.trace import print_request_trace
    from frontier.targets.local import gateway as local_gateway
    from frontier.targets.local.traces import SPANS_FILE

    multi = dm.two_model_settings(settings)
    # The stack now serves two models: each pool's hosts get a principal of their own, the deploy
    # role the second model's weights.
    identities = local.identities(multi)
    console.print(f"  {identities.name:<16} {identities.state:<8} {identities.detail}")
    # The second model's runtimes read a key secret of their own, which its principal alone reads.
    for secret in local.api_key_secrets(multi):
        if secret.state == "created":
            console.print(f"  {secret.name:<16} {secret.state:<8} {secret.detail}")
    # Each pool's slots now sign as that pool's principal (its weights, secret and history only).
    for slot in local.host_slots(multi):
        if slot.state not in ("exists", "running"):
            console.print(f"  {slot.name:<16} {slot.state:<8} {slot.detail}")
    push_weights(multi, multi.pool(dm.SMALL_MODEL).model, dm.small_model_dir(settings))
    for served in multi.pools:
        console.print(f"  deploy --model {served.name} ({len(served.hosts)} host slot(s))")
        # What fab deploy --model rolls: the stack as that pool sees it (its hosts, its history).
        roll("deploy", multi.for_pool(served.name), digest)
    dm.keep_out_of_balancer(settings, pool, multi, backend_for(settings).balancer())
    for component in dm.start_gateway(multi):
        console.print(f"  {component.name:<16} {component.state:<8} {component.detail}")
    url = local_gateway.gateway_url(multi)
    acme, nightly = local_gateway.tenant_key(multi, "acme"), local_gateway.tenant_key(multi, "nightly")
    # One request's trace, gateway to runtime, as the local stack's OTLP receiver got it.
    print_request_trace(url, acme, pool.name, local.state_dir(multi) / SPANS_FILE, console)
    phases = []
    for model in (pool.name, dm.SMALL_MODEL):
        phases.append(Phase(f"gateway: acme on {model}", dm.gateway_requests(url, acme, model, 8)))
        tally.add(phases[-1].samples)
    # nightly's class is batch (served on capacity interactive work leaves free); 4 at once is
    # its max_concurrent_requests.
    phases.append(
        Phase(
            f"gateway: nightly (batch) on {dm.SMALL_MODEL}",
            dm.gateway_requests(url, nightly, dm.SMALL_MODEL, 4),
        )
    )
    tally.add(phases[-1].samples)
    status = dm.refused(url, nightly, pool.name)
    console.print(f"  nightly asking for {pool.name} (not its model): HTTP {status}")
    if status != 404:
        raise FrontierError(f"tenant nightly reached {pool.name}: HTTP {status}, expected 404")
    summary, took = dm.batch_job(settings, url, nightly, 16)
    console.print(
        f"  nightly batch job at batch priority: {summary.succeeded} ok, {summary.failed} failed, "
        f"{summary.malformed} malformed in {took:.1f}s"
    )
    if summary.failed or summary.malformed:
        raise FrontierError(
            f"the batch job had {summary.failed} failed and {summary.malformed} malformed lines"
        )
    # The first model's pool: two replicas, so a stream has one to move to.
    first = next(served.name for served in multi.pools if served.name != dm.SMALL_MODEL)
    phases.append(migration_part(multi, first, acme, tally))
    rows, prices, uri = dm.usage_rows(multi)
    usage = usage_table(multi.stack, uri, rows, prices)
    phases.append(zero_part(multi, dm.SMALL_MODEL, acme, tally))
    return phases, usage


def migration_part(multi: Settings, model: str, key: str, tally: Tally) -> Phase:
    """One stream whose replica gets a notice mid-stream, moved to the other replica of its pool."""
    from frontier.demo.migration import demo_part

    step(f"13a. migration: a {model} stream's replica gets a notice mid-stream")
    run = demo_part(multi, model, key, say=lambda line: console.print(f"  {line}"))
    tally.add([run.sample])
    return Phase(f"migration: {run.migrations:.0f} moved, stall {run.stall_s * 1000:.0f} ms", [run.sample])


def zero_part(multi: Settings, model: str, key: str, tally: Tally) -> Phase:
    """The second model's pool to zero, requests held by the gateway while a slot launches, back to zero."""
    from frontier.demo.zero import demo_part

    step(f"13b. scale from zero: {model}'s pool at zero, requests held by the gateway while a slot launches")
    run = demo_part(multi, model, key, say=lambda line: console.print(f"  {line}"))
    tally.add(run.samples)
    if run.failed:
        raise FrontierError(f"{model} from zero: {run.failed} of {len(run.samples)} held requests failed")
    ttft = "n/a" if run.first_ttft_s is None else f"{run.first_ttft_s:.1f}s"
    return Phase(f"from zero: {model}, first TTFT {ttft}", run.samples, run.launch_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m frontier.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--stack", "-s", default=None, help="a stack with a local: section (default local)")
    parser.add_argument(
        "--rate", type=float, default=2.0, help="requests/s of the load during the rollouts (default 2)"
    )
    parser.add_argument(
        "--load-seconds", type=float, default=10.0, help="length of the short load test (default 10)"
    )
    parser.add_argument("--keep-up", action="store_true", help="leave the local stack running at the end")
    args = parser.parse_args(argv)
    if args.rate <= 0 or args.load_seconds <= 0:
        parser.error(f"--rate ({args.rate}) and --load-seconds ({args.load_seconds}) must be > 0")
    code = 2
    settings = None
    tally = Tally()
    try:
        loaded = load_stack(args.stack)
        local.require_local(loaded, "the demo runs on the embedded local stack")
        settings = loaded
        # Every AWS call of the demo goes to the stack's moto, whatever the shell's AWS settings are.
        with local.aws_environment(settings):
            code = run(settings, chosen_pool(settings), args.rate, args.load_seconds, tally)
    except FrontierError as exc:
        console.print(f"[red]demo failed: {exc}[/]")
        code = 2
    except ClientError as exc:
        # An AWS call refused (an action the actor's policy does not allow): one line naming it.
        console.print(f"[red]demo failed: {refusal(exc)}[/]", soft_wrap=True)
        code = 2
    except KeyboardInterrupt:
        console.print("[red]interrupted[/]")
        code = 130
    except Exception:  # noqa: BLE001 - show it, take the stack down, and still end with the summary line
        console.print_exception()
        code = 2
    finally:
        if settings is not None and not args.keep_up:
            console.print(
                "local.down: "
                + ", ".join(f"{c.name} {c.state}" for c in local.down(settings) if c.state == "stopped")
            )
        elif settings is not None and args.keep_up:
            console.print(
                f"the local stack stays up: `fab status -s {settings.stack}`, `fab local.down -s {settings.stack}`"
            )
    print(tally.line(), flush=True)
    return code if code else (1 if tally.failed else 0)


if __name__ == "__main__":
    sys.exit(main())
