"""The price-latency chart of an exploration, as a PNG (matplotlib, Agg: no display needed)."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from frontier.capacity.explore import ExpertParallelRow, Exploration, Option, why_no_option
from frontier.capacity.quality import QualityPoint, QualityRun
from frontier.config.schema import PoolSettings, Settings, Slo


def _pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend: a PNG is written without a display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, out: Path) -> Path:
    """``fig`` laid out and written to ``out`` (its folder made), then closed; returns ``out``."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _scatter_by(
    ax: Any,
    options: tuple[Option, ...],
    key: Callable[[Option], str],
    label: str,
    *,
    size: float,
    alpha: float,
) -> list[str]:
    """Options as TPOT vs cost points, one colour per ``key`` (in sorted order, which it returns)."""
    import matplotlib.pyplot as plt

    cmap = plt.get_cmap("tab10")
    groups = sorted({key(o) for o in options})
    for i, group in enumerate(groups):
        mine = [o for o in options if key(o) == group]
        ax.scatter(
            [o.tpot_ms for o in mine],
            [o.cost_per_million for o in mine],
            s=size,
            alpha=alpha,
            color=cmap(i % 10),
            label=label.format(group),
        )
    return groups


def pareto_png(ex: Exploration, slo: Slo, out: Path) -> Path:
    """Every option (cost per 1M output tokens vs TPOT at its best SLO point), the front, the stack's
    current choice and the cheapest option."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 5.2))
    _scatter_by(ax, ex.options, lambda o: o.candidate.gpu_type, "{}", size=22, alpha=0.55)
    ax.plot(
        [o.tpot_ms for o in ex.front],
        [o.cost_per_million for o in ex.front],
        "k-",
        linewidth=1.2,
        marker="o",
        markersize=5,
        label="Pareto front",
    )
    for o in ex.front:
        ax.annotate(
            o.candidate.label,
            (o.tpot_ms, o.cost_per_million),
            fontsize=7,
            xytext=(4, 4),
            textcoords="offset points",
        )
    cheap = ex.cheapest
    ax.scatter(
        [cheap.tpot_ms],
        [cheap.cost_per_million],
        s=160,
        facecolors="none",
        edgecolors="green",
        linewidths=2,
        label=f"cheapest meeting every SLO: {cheap.candidate.label}",
    )
    if ex.current is not None:
        ax.scatter(
            [ex.current.tpot_ms],
            [ex.current.cost_per_million],
            s=160,
            marker="*",
            color="red",
            label=f"current: {ex.current.candidate.label}",
        )
    ax.axvline(slo.tpot_ms, color="red", linestyle=":", label=f"slo.tpot_ms {slo.tpot_ms:g}")
    ax.set_xlabel("TPOT at the largest concurrency meeting every SLO (ms, modelled)")
    ax.set_ylabel("cost per 1M output tokens ($, one replica at that load)")
    ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")
    ax.set_title(
        f"stack {ex.stack}: price vs latency of {len(ex.options)} options ({ex.considered} candidates)"
    )
    return _save(fig, out)


def expert_parallel_png(
    rows: tuple[ExpertParallelRow, ...], settings: Settings, pool: PoolSettings, out: Path
) -> Path:
    """Cost per 1M output tokens and TPOT against expert parallel, inside and across the NVLink domain."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.6))
    ok = [r for r in rows if r.cost_per_million is not None and r.point is not None]
    for inside, colour, label in (
        (True, "tab:green", "inside the NVLink domain"),
        (False, "tab:red", "across nodes"),
    ):
        mine = [r for r in ok if r.inside_nvlink == inside]
        ax.plot(
            [r.expert_parallel for r in mine],
            [r.cost_per_million or 0.0 for r in mine],
            marker="o",
            color=colour,
            label=f"$/1M output tokens, {label}",
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("expert parallel (GPUs the experts are spread over)")
    ax.set_ylabel("cost per 1M output tokens ($, modelled)")
    ax.axvline(pool.group.nvlink_domain_gpus, color="grey", linestyle=":", label="NVLink domain")
    twin = ax.twinx()
    twin.plot(
        [r.expert_parallel for r in ok],
        [r.point.tpot_s * 1e3 if r.point is not None else float("nan") for r in ok],
        "k--",
        marker=".",
        label="TPOT ms",
    )
    twin.set_ylabel("TPOT at that point (ms)")
    ax.grid(True, alpha=0.3)
    handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(handles=handles, fontsize=7, loc="upper left")
    ax.set_title(f"stack {settings.stack}: expert parallel inside vs across the NVLink domain")
    return _save(fig, out)


def quality_png(
    ex: Exploration, points: tuple[QualityPoint, ...], run: QualityRun | None, slo: Slo, out: Path
) -> Path:
    """Two panels side by side: price vs TPOT (every option, the front) and price vs pass rate (each
    variant of weights and KV cache at its cheapest option meeting every SLO, the front marked).
    A variant whose pass rate was not measured is listed under the chart with the reason, never placed."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5.6))
    cmap = plt.get_cmap("tab10")
    quantizations = _scatter_by(
        left, ex.options, lambda o: o.candidate.quantization, "weights {}", size=16, alpha=0.5
    )
    left.plot(
        [o.tpot_ms for o in ex.front],
        [o.cost_per_million for o in ex.front],
        "k-",
        marker="o",
        ms=4,
        label="front",
    )
    left.axvline(slo.tpot_ms, color="red", linestyle=":", label=f"slo.tpot_ms {slo.tpot_ms:g}")
    left.set_xlabel("TPOT at the largest concurrency meeting every SLO (ms, modelled)")
    left.set_ylabel("cost per 1M output tokens ($)")
    left.set_yscale("log")
    left.grid(True, alpha=0.3)
    left.legend(fontsize=7)
    left.set_title(f"price vs latency: {len(ex.options)} options")

    placed = [p for p in points if p.option is not None and p.pass_rate is not None]
    for p in placed:
        assert p.option is not None and p.pass_rate is not None
        right.scatter(
            [p.pass_rate],
            [p.option.cost_per_million],
            s=90 if p.on_front else 40,
            marker="o" if p.variant.kv_cache_dtype != "fp8" else "s",
            color=cmap(quantizations.index(p.variant.quantization) % 10)
            if p.variant.quantization in quantizations
            else "grey",
            edgecolors="black" if p.on_front else "none",
        )
        right.annotate(
            p.variant.label,
            (p.pass_rate, p.option.cost_per_million),
            fontsize=7,
            xytext=(5, 4),
            textcoords="offset points",
        )
    front = sorted((p for p in placed if p.on_front), key=lambda p: p.pass_rate or 0.0)
    if front:
        right.plot(
            [p.pass_rate for p in front],
            [p.option.cost_per_million for p in front if p.option is not None],
            "k--",
            linewidth=1,
            label="front: no variant both cheaper and passing more",
        )
    missing = [
        f"{p.variant.label}: "
        + (
            why_no_option(ex, p.variant.quantization)
            if p.option is None
            else (
                p.quality.not_measured
                if p.quality is not None
                else "pass rate not measured (fab plan --explore --quality)"
            )
        )
        for p in points
        if p.option is None or p.pass_rate is None
    ]
    if missing:
        # Top left, under the legend: the measured points sit at the right, where pass rates are high.
        right.text(
            0.01,
            0.90,
            "not placed:\n" + "\n".join(textwrap.fill(line, 58, subsequent_indent="  ") for line in missing),
            transform=right.transAxes,
            fontsize=7,
            va="top",
            bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "grey"},
        )
    right.set_xlabel(
        "pass rate of the verification set" + (f" ({run.weights} weights, scaled model)" if run else "")
    )
    right.set_ylabel("cost per 1M output tokens ($, cheapest option of the variant)")
    right.set_xlim(-0.02, 1.05)
    right.grid(True, alpha=0.3)
    if front:
        right.legend(fontsize=7, loc="upper left")
    right.set_title("price vs pass rate, by weights and KV cache dtype")
    fig.suptitle(f"stack {ex.stack}: the price, latency and pass rate of each option")
    return _save(fig, out)
