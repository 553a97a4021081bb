"""The price-latency chart of an exploration, as a PNG (matplotlib, Agg: no display needed)."""

from __future__ import annotations

from pathlib import Path

from frontier.capacity.explore import ExpertParallelRow, Exploration
from frontier.config.schema import Settings, Slo


def pareto_png(ex: Exploration, slo: Slo, out: Path) -> Path:
    """Every option (cost per 1M output tokens vs TPOT at its best SLO point), the front, the stack's
    current choice and the cheapest option."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.2))
    gpus = sorted({o.candidate.gpu_type for o in ex.options})
    cmap = plt.get_cmap("tab10")
    for i, gpu in enumerate(gpus):
        mine = [o for o in ex.options if o.candidate.gpu_type == gpu]
        ax.scatter(
            [o.tpot_ms for o in mine],
            [o.cost_per_million for o in mine],
            s=22,
            alpha=0.55,
            color=cmap(i % 10),
            label=gpu,
        )
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
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def expert_parallel_png(rows: tuple[ExpertParallelRow, ...], settings: Settings, out: Path) -> Path:
    """Cost per 1M output tokens and TPOT against expert parallel, inside and across the NVLink domain."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    ax.axvline(settings.serving_group.nvlink_domain_gpus, color="grey", linestyle=":", label="NVLink domain")
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
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
