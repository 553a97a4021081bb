"""Colocated or prefill/decode (P/D) replicas for a pool's traffic: the roofline of each, and the pick.

A colocated replica runs new prompts in the same steps as the streams it is decoding: every step
that carries a prompt's chunk is an inter-token gap of every running stream. With chunks of c
tokens, a prompt of P tokens takes ceil(P / c) such steps; prompts arriving at λ per second make
λ x ceil(P / c) mixed steps a second, and the share of a stream's gaps that are mixed steps is
those over all steps (the rest of the time is plain decode steps). Inter-token latency (ITL) p99
is the mixed step's time once that share reaches 1 %, p50 once it reaches half: short prompts
hardly show, long ones set the tail. Steps are ``roofline.step`` on the replica's device.

P/D splits the two. A prefill replica (``kv_transfer.role: prefill``) runs prompts only, packed up
to the token budget (``max_num_batched_tokens``) a step; it answers one token and leases the
prompt's full blocks. A decode replica pulls those blocks and computes only the prompt's tail (the
tokens past the last full block before the last token, as the runtime does), then decodes. So:

- TTFT = the prompt's prefill steps alone + the KV transfer + the decode replica's tail step;
- the transfer = the leased blocks' KV bytes over the interconnect's rate plus a fixed cost per
  pull. On a host whose replicas talk over TCP (a CPU host: the runtime's own transfer) the rate is
  **measured** (``kv_transfer_speed.json``, written by ``bench/kv_transfer_rate.py
  --write-table``). On a GPU node group it is the instance's network figure from
  ``gpus.NETWORK_GBPS`` (EFA where the type has it), one GPU's share: a datasheet figure,
  **unmeasured here**;
- decode ITL: plain decode steps, plus one tail step per arriving prompt (a few tokens);
- each half is sized for the peak on its own (its requests per second at full load), and the cost
  per 1M output tokens adds both halves' replica-hours.

A layout passes when its mean TTFT and end-to-end latency meet ``slo.ttft_ms`` and
``slo.p99_latency_ms`` (as the sweep judges them) and its ITL **p99** meets ``slo.tpot_ms``: a
stream stalled behind a prompt breaks the time per token its reader sees. The pick is the cheaper
per 1M output tokens of those that pass (colocated when neither passes). The runtime moves one
rank's cache (``kv_transfer`` needs a replica of one rank), so P/D is modelled for TP 1 only, and
a split is offered only where the stack loader would take it as the pool's ``disaggregation``
setting (``split_refused``: the local stack, a pool without prefix caching, ... are refused, the
rule quoted).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import ValidationError

from frontier.capacity.explore import Candidate, Exploration, Option, option_device, variant
from frontier.capacity.gpus import INSTANCES, NETWORK_GBPS
from frontier.capacity.plan import replicas_for_peak, rollout_spare
from frontier.capacity.replica import ReplicaModel
from frontier.capacity.roofline import Device, Efficiency, Replica, step
from frontier.config.memory import kv_bytes_per_token
from frontier.config.schema import (
    DTYPE_BYTES,
    DisaggregatedRole,
    Disaggregation,
    NodeGroup,
    PoolSettings,
    Settings,
    Slo,
)
from frontier.errors import FrontierError
from frontier.figures import size

TABLE = Path(__file__).with_name("kv_transfer_speed.json")


# -- the transfer ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class MeasuredTransfer:
    layout: str  # the KV layout the bench moved
    block_bytes: int
    per_pull_s: float  # the fixed cost of one pull: connect, ask, lease check
    bytes_per_s: float
    source: str  # the bench command, the machine, the date


@dataclass(frozen=True)
class TransferRate:
    """What moving a prompt's KV from a prefill replica to a decode replica costs."""

    over: str  # the interconnect and where its figure comes from
    bytes_per_s: float
    per_pull_s: float
    measured: bool

    def seconds(self, nbytes: float) -> float:
        return self.per_pull_s + nbytes / self.bytes_per_s


def read_table(path: Path = TABLE) -> tuple[MeasuredTransfer, ...]:
    data = json.loads(path.read_text())
    return tuple(MeasuredTransfer(**row) for row in data["measurements"])


@cache
def _committed() -> tuple[MeasuredTransfer, ...]:
    return read_table()


def measured_tcp(block_bytes: int, table: Sequence[MeasuredTransfer] | None = None) -> TransferRate:
    """The runtime's TCP transfer as measured for the KV layout nearest ``block_bytes`` a block."""
    rows = tuple(table if table is not None else _committed())
    if not rows:
        raise FrontierError(
            f"{TABLE.name} holds no measurement: bench/kv_transfer_rate.py --write-table measures the transfer"
        )
    row = min(rows, key=lambda r: abs(math.log(r.block_bytes / block_bytes)))
    return TransferRate(
        over=f"TCP, measured {row.bytes_per_s / 1e9:.2f} GB/s + {row.per_pull_s * 1e3:.1f} ms a pull "
        f"for {row.layout} ({row.source})",
        bytes_per_s=row.bytes_per_s,
        per_pull_s=row.per_pull_s,
        measured=True,
    )


def transfer_rate(
    group: NodeGroup, block_bytes: int, eff: Efficiency, table: Sequence[MeasuredTransfer] | None = None
) -> TransferRate | None:
    """The rate between a pool's prefill and decode replicas on ``group``'s instance type: measured
    TCP on a CPU host, the instance's network figure (unmeasured here) on a GPU node; None where the
    instance type's network is not in the table."""
    if group.accelerator == "cpu":
        return measured_tcp(block_bytes, table)
    inst = INSTANCES.get(group.instance_type)
    if inst is None or inst.name not in NETWORK_GBPS:
        return None
    link = "EFA" if group.efa else "network"
    return TransferRate(
        over=f"{link} of {inst.name}, {NETWORK_GBPS[inst.name]:g} Gbit/s / {inst.gpus_per_node} GPUs = "
        f"{inst.network_bandwidth / 1e9:.2f} GB/s a replica (datasheet, unmeasured here)",
        bytes_per_s=inst.network_bandwidth,
        per_pull_s=eff.network_latency_s,
        measured=False,
    )


# -- inter-token latency under prefill interference ------------------------------------------------


@dataclass(frozen=True)
class Interference:
    """The inter-token gaps a decoding stream sees: plain decode steps and steps carrying a prompt."""

    plain_s: float
    mixed_s: float
    mixed_share: float  # of the gaps

    @property
    def p50_s(self) -> float:
        return max(self.plain_s, self.mixed_s) if self.mixed_share >= 0.5 else self.plain_s

    @property
    def p99_s(self) -> float:
        return max(self.plain_s, self.mixed_s) if self.mixed_share >= 0.01 else self.plain_s

    @property
    def mean_s(self) -> float:
        return self.mixed_share * self.mixed_s + (1 - self.mixed_share) * self.plain_s


def interference(
    device: Device,
    eff: Efficiency,
    replica: Replica,
    *,
    streams: int,
    context: float,
    chunk: int,
    chunks_per_prompt: int,
    attended: float,
    prompts_per_s: float,
    joining: bool = True,
) -> Interference:
    """Gaps of ``streams`` streams decoding at ``context`` tokens while prompts arrive at
    ``prompts_per_s``, each entering in ``chunks_per_prompt`` steps of ``chunk`` tokens.
    ``joining``: the prompt's request is one of the streams (a colocated replica's batch holds
    it while it prefills), else it comes on top of them (a decode replica's tail step)."""
    plain = step(device, eff, replica, decode_seqs=streams, context=context).total_s
    mixed = step(
        device,
        eff,
        replica,
        decode_seqs=max(0, streams - 1) if joining else streams,
        context=context,
        prefill_tokens=chunk,
        prefill_attended=attended,
        new_requests=1 / max(1, chunks_per_prompt),
    ).total_s
    busy = min(1.0, prompts_per_s * chunks_per_prompt * mixed)  # the share of time in mixed steps
    mixed_per_s = busy / mixed
    plain_per_s = (1 - busy) / plain
    share = mixed_per_s / (mixed_per_s + plain_per_s) if mixed_per_s + plain_per_s else 0.0
    return Interference(plain, mixed, share)


def colocated_chunk(replica: Replica, prompt: int, streams: int) -> int:
    """The chunk a new prompt enters a colocated step in: what the other streams leave of the budget."""
    if not replica.chunked_prefill:
        return prompt
    return min(prompt, max(1, replica.max_num_batched_tokens - (streams - 1)))


def prompt_tail(prompt: int, block_size: int) -> int:
    """Tokens a decode replica computes of a pulled prompt: past the last full block before the last token."""
    return prompt - (prompt - 1) // block_size * block_size


def colocated_interference(
    device: Device,
    eff: Efficiency,
    replica: Replica,
    prompt: int,
    streams: int,
    context: float,
    prompts_per_s: float,
) -> Interference:
    chunk = colocated_chunk(replica, prompt, streams)
    return interference(
        device,
        eff,
        replica,
        streams=streams,
        context=context,
        chunk=chunk,
        chunks_per_prompt=math.ceil(prompt / chunk),
        attended=prompt / 2,
        prompts_per_s=prompts_per_s,
    )


def decode_interference(
    device: Device,
    eff: Efficiency,
    replica: Replica,
    prompt: int,
    block_size: int,
    streams: int,
    context: float,
    prompts_per_s: float,
) -> Interference:
    """A decode replica's gaps: plain decode steps, and one step per pulled prompt computing its tail."""
    return interference(
        device,
        eff,
        replica,
        streams=streams,
        context=context,
        chunk=prompt_tail(prompt, block_size),
        chunks_per_prompt=1,
        attended=prompt,
        prompts_per_s=prompts_per_s,
        joining=False,
    )


@dataclass(frozen=True)
class Prefill:
    """A prefill replica running prompts only."""

    alone_s: float  # one prompt's prefill on an idle replica
    prompts_per_s: float  # at full load, prompts packed up to the token budget a step


def prefill_only(device: Device, eff: Efficiency, replica: Replica, prompt: int) -> Prefill:
    budget = replica.max_num_batched_tokens
    chunk = min(prompt, budget)
    one = step(
        device, eff, replica, decode_seqs=0, context=0, prefill_tokens=chunk, prefill_attended=prompt / 2,
        new_requests=chunk / prompt,
    ).total_s  # fmt: skip
    alone = math.ceil(prompt / chunk) * one
    packed = max(1, min(budget // prompt, replica.max_batch_size))
    if packed == 1:
        return Prefill(alone, 1 / alone)
    full = step(
        device, eff, replica, decode_seqs=0, context=0, prefill_tokens=packed * prompt,
        prefill_attended=prompt / 2, new_requests=packed,
    ).total_s  # fmt: skip
    return Prefill(alone, packed / full)


# -- the layouts and the pick ----------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """One way to serve the pool: colocated replicas (an option of the sweep) or P/D halves."""

    kind: Literal["colocated", "P/D"]
    candidate: Candidate
    ttft_s: float
    itl: Interference
    e2e_s: float
    transfer_s: float  # 0 colocated
    transfer_bytes: float
    output_tokens_per_s: float  # one decoding replica's at full load
    cost_per_million: float  # replica-hours of both halves per 1M output tokens at full load
    prefill_replicas: int  # 0 colocated
    replicas: int  # colocated replicas, or decode replicas
    nodes: int
    fleet_cost_per_hour: float
    broken: tuple[str, ...]  # the SLOs it breaks, each with its figure
    rate: TransferRate | None = None
    decode_batch: int = 0

    @property
    def passes(self) -> bool:
        return not self.broken


def judge(slo: Slo, ttft_s: float, itl: Interference, e2e_s: float) -> tuple[str, ...]:
    broken = []
    if ttft_s * 1e3 > slo.ttft_ms:
        broken.append(f"slo.ttft_ms ({ttft_s * 1e3:,.0f} > {slo.ttft_ms:g})")
    if itl.p99_s * 1e3 > slo.tpot_ms:
        broken.append(f"slo.tpot_ms at ITL p99 ({itl.p99_s * 1e3:,.1f} > {slo.tpot_ms:g})")
    if e2e_s * 1e3 > slo.p99_latency_ms:
        broken.append(f"slo.p99_latency_ms ({e2e_s * 1e3:,.0f} > {slo.p99_latency_ms:g})")
    return tuple(broken)


def colocated_layout(settings: Settings, pool: PoolSettings, model: ReplicaModel, option: Option) -> Layout:
    cap, c = settings.capacity, option.candidate
    candidate = variant(settings, pool, c).pool(pool.name)
    device, eff, replica = option_device(pool.group, pool.model.dtype, model, c, candidate)
    p = option.point
    itl = colocated_interference(
        device, eff, replica, cap.avg_prompt_tokens, p.batch,
        cap.avg_prompt_tokens + cap.avg_output_tokens / 2, p.requests_per_s,
    )  # fmt: skip
    return Layout(
        kind="colocated",
        candidate=option.candidate,
        ttft_s=p.ttft_s,
        itl=itl,
        e2e_s=p.e2e_s,
        transfer_s=0.0,
        transfer_bytes=0.0,
        output_tokens_per_s=p.output_tokens_per_s,
        cost_per_million=option.cost_per_million,
        prefill_replicas=0,
        replicas=option.plan.replicas,
        nodes=option.plan.nodes,
        fleet_cost_per_hour=option.plan.cost_per_hour,
        broken=judge(settings.slo, p.ttft_s, itl, p.e2e_s),
    )


def disaggregated_layout(
    settings: Settings,
    pool: PoolSettings,
    model: ReplicaModel,
    c: Candidate,
    table: Sequence[MeasuredTransfer] | None = None,
) -> Layout | str:
    """The candidate's replica of ``pool`` split into prefill and decode halves, each of one rank; or why not."""
    if (c.tensor_parallel, c.pipeline_parallel, c.expert_parallel) != (1, 1, 1):
        return "P/D moves one rank's KV cache: a replica of TP x PP x EP > 1 is not split"
    cap, slo = settings.capacity, settings.slo
    s = variant(settings, pool, c)
    half = s.pool(pool.name)  # the pool as the candidate has it: its group and runtime
    device, eff, replica = option_device(pool.group, pool.model.dtype, model, c, half)
    group, rt = half.group, half.runtime
    prompt, output = cap.avg_prompt_tokens, cap.avg_output_tokens
    bs = rt.block_size
    kv_dtype = half.model.dtype if c.kv_cache_dtype == "auto" else c.kv_cache_dtype
    per_token = kv_bytes_per_token(half.model, DTYPE_BYTES[kv_dtype])
    rate = transfer_rate(group, bs * per_token, eff, table)
    if rate is None:
        return f"the network of {group.instance_type} is not in frontier/capacity/gpus.py NETWORK_GBPS"
    moved = (prompt - 1) // bs * bs * per_token
    transfer = rate.seconds(moved) if moved else 0.0
    pre = prefill_only(device, eff, replica, prompt)
    context = prompt + output / 2
    best: tuple[int, Interference, float, float, float] | None = None
    for b in range(1, min(replica.max_batch_size, replica.max_concurrency) + 1):
        rps, itl = 0.0, decode_interference(device, eff, replica, prompt, bs, b, context, 0.0)
        for _ in range(3):  # the arrivals set the tail steps, which set the rate: settles in a few rounds
            rps = b / (output * itl.mean_s)
            itl = decode_interference(device, eff, replica, prompt, bs, b, context, rps)
        ttft = pre.alone_s + transfer + itl.mixed_s
        e2e = ttft + (output - 1) * itl.mean_s
        if judge(slo, ttft, itl, e2e):
            if best is None:
                best = (b, itl, ttft, e2e, rps)  # none passes: report the first, with what it breaks
            break
        best = (b, itl, ttft, e2e, rps)
    assert best is not None
    b, itl, ttft, e2e, decode_rps = best
    per_node = group.gpus_per_node  # one rank a replica
    replica_cost = group.price_per_hour / per_node
    per_million = (replica_cost / pre.prompts_per_s + replica_cost / decode_rps) / (output * 3600) * 1e6
    spare = rollout_spare(s, per_node).replicas
    prefills = replicas_for_peak(cap.peak_qps, cap.safety_factor, pre.prompts_per_s) + spare
    decodes = replicas_for_peak(cap.peak_qps, cap.safety_factor, decode_rps) + spare
    nodes = math.ceil(prefills / per_node) + math.ceil(decodes / per_node)
    refused = split_refused(s, half, prefills, decodes)
    if refused:
        return f"the split is refused by the stack's own rules: {refused}"
    return Layout(
        kind="P/D",
        candidate=c,
        ttft_s=ttft,
        itl=itl,
        e2e_s=e2e,
        transfer_s=transfer,
        transfer_bytes=moved,
        output_tokens_per_s=decode_rps * output,
        cost_per_million=per_million,
        prefill_replicas=prefills,
        replicas=decodes,
        nodes=nodes,
        fleet_cost_per_hour=nodes * group.price_per_hour,
        broken=judge(slo, ttft, itl, e2e),
        rate=rate,
        decode_batch=b,
    )


def prefill_group_name(group: NodeGroup) -> str:
    """The node group a pool's prefill half is printed on: named after its decode group."""
    return f"{group.name}-prefill"


def split_refused(stack: Settings, pool: PoolSettings, prefills: int, decodes: int) -> str:
    """Why the stack loader would refuse ``pool`` split into these halves ("" where it would not):
    the pool and the stack validated as a stack file's would be, with the prefill group added."""
    prefill_group = pool.group.model_copy(update={"name": prefill_group_name(pool.group)})
    halves = Disaggregation(
        prefill=DisaggregatedRole(group=prefill_group, replicas=prefills),
        decode=DisaggregatedRole(group=pool.group, replicas=decodes),
    )
    try:
        split = PoolSettings.model_validate({**dict(pool), "replicas": None, "disaggregation": halves})
        Settings.model_validate(
            {
                **dict(stack),
                "node_groups": (*stack.node_groups, prefill_group),
                "pools": tuple(split if p.name == pool.name else p for p in stack.pools),
            }
        )
    except ValidationError as err:
        return "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in err.errors())
    return ""


@dataclass(frozen=True)
class Choice:
    """Colocated and P/D layouts for the pool's prompt and output lengths, the pick and why."""

    prompt: int
    output: int
    layouts: tuple[Layout, ...]  # per instance type: its best colocated and its best P/D, cheapest first
    picked: Layout
    reason: str
    not_split: tuple[tuple[str, int], ...]  # why candidates have no P/D layout, counted

    def disaggregation_yaml(self, group_name: str) -> str:
        """The picked P/D layout as a pool's ``disaggregation`` setting ("" when colocated is picked)."""
        p = self.picked
        if p.kind != "P/D":
            return ""
        return (
            "disaggregation:\n"
            f"  prefill: {{node_group: {group_name}-prefill, replicas: {p.prefill_replicas}}}\n"
            f"  decode: {{node_group: {group_name}, replicas: {p.replicas}}}"
        )


def _best(layouts: Iterable[Layout]) -> Layout | None:
    ranked = sorted(layouts, key=lambda x: (not x.passes, x.cost_per_million))
    return ranked[0] if ranked else None


def choose(
    settings: Settings,
    pool: PoolSettings,
    model: ReplicaModel,
    ex: Exploration,
    table: Sequence[MeasuredTransfer] | None = None,
) -> Choice:
    """Every option of the sweep as colocated, every one-rank option split into P/D, and the pick."""
    cap = settings.capacity
    colocated = [colocated_layout(settings, pool, model, o) for o in ex.options]
    split: list[Layout] = []
    why_not: dict[str, int] = {}
    seen: set[tuple[str, str, str]] = set()
    # A larger max_batch_size only widens the decode half's scan: split the largest that fits.
    for o in sorted(ex.options, key=lambda o: -o.candidate.max_batch_size):
        c = o.candidate
        key = (c.instance_type, c.kv_cache_dtype, c.quantization)
        if c.tensor_parallel == 1 and c.pipeline_parallel == 1 and c.expert_parallel == 1 and key in seen:
            continue
        got = disaggregated_layout(settings, pool, model, c, table)
        if isinstance(got, str):
            why_not[got] = why_not.get(got, 0) + 1
            continue
        seen.add(key)
        split.append(got)
    shown: list[Layout] = []
    for instance in sorted({x.candidate.instance_type for x in (*colocated, *split)}):
        for group in (colocated, split):
            best = _best(x for x in group if x.candidate.instance_type == instance)
            if best is not None:
                shown.append(best)
    shown.sort(key=lambda x: (not x.passes, x.cost_per_million))
    col, pd = _best(colocated), _best(split)
    assert col is not None  # the sweep has at least one option
    picked = (
        pd
        if pd is not None and pd.passes and (not col.passes or pd.cost_per_million < col.cost_per_million)
        else col
    )
    reason = _reason(settings, picked, col, pd, colocated, why_not)
    return Choice(
        prompt=cap.avg_prompt_tokens,
        output=cap.avg_output_tokens,
        layouts=tuple(shown),
        picked=picked,
        reason=reason,
        not_split=tuple(sorted(why_not.items(), key=lambda kv: -kv[1])),
    )


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms"


def _reason(
    settings: Settings,
    picked: Layout,
    col: Layout,
    pd: Layout | None,
    colocated: Sequence[Layout],
    why_not: dict[str, int],
) -> str:
    prompt, tpot = settings.capacity.avg_prompt_tokens, settings.slo.tpot_ms
    if pd is None:
        why = "; ".join(why_not) or "no option to split"
        return f"colocated on {col.candidate.label}: P/D is not offered ({why})"
    # P/D is weighed against colocated replicas on its own GPUs (the interference it removes) and
    # against the cheapest colocated option of all (what it must beat).
    on = (
        picked
        if picked is col
        else _best(x for x in colocated if x.candidate.instance_type == pd.candidate.instance_type) or col
    )
    raised = on.itl.p99_s - on.itl.plain_s
    verdict = "over" if on.itl.p99_s * 1e3 > tpot else "within"
    interference_text = (
        f"prefill interference raises decode ITL p99 by {_ms(raised)} ({_ms(on.itl.plain_s)} -> "
        f"{_ms(on.itl.p99_s)}, {verdict} slo.tpot_ms {tpot:g}) at {prompt:,} input tokens on colocated "
        f"{on.candidate.label}"
    )
    transfer_text = (
        f"the KV transfer costs {_ms(pd.transfer_s)} a prompt ({size(pd.transfer_bytes)} over "
        f"{pd.rate.over if pd.rate else '-'})"
    )
    costs = (
        f"P/D on {pd.candidate.label} ${pd.cost_per_million:.3g} vs colocated on {col.candidate.label} "
        f"${col.cost_per_million:.3g} per 1M output tokens"
    )
    if picked is pd:
        why = "no colocated option meets every SLO" if not col.passes else "P/D is cheaper"
        return f"P/D: {interference_text}; {transfer_text}; {why}: {costs}"
    if not pd.passes and not col.passes:
        return f"colocated: neither layout meets every SLO (P/D breaks {', '.join(pd.broken)}); {interference_text}"
    why = "P/D breaks " + ", ".join(pd.broken) if not pd.passes else "colocated is cheaper"
    return f"colocated: {interference_text}; {transfer_text}; {why}: {costs}"
