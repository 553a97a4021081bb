"""The quality axis of an exploration: the pass rate of the stack's verification set for each variant
of weights (``model.quantization``) and KV cache dtype, measured on this machine's engine.

What is measured, and on what:
- The model is the stack's own architecture scaled to a size this machine runs in seconds: the same
  head dimension, grouped-query ratio, MLP ratio, tied or untied embeddings and dtype, with fewer heads
  and two layers (``scaled_shape``). Its weights are random unless the stack's weights are on this
  machine. Random weights make the logits flat, so a quantization error flips greedy tokens more often
  than it would in a trained model: the figures are a lower bound on a trained model's pass rate, and
  the chart says which weights were used.
- The reference is the unquantized weights with the stack's KV cache dtype. Its greedy outputs are
  recorded as the golden outputs of a copy of the verification set; every variant then runs the whole
  set (normal, over-long, bad-input, structured, multi-turn and golden cases) through a real runtime
  process on a loopback port, exactly as ``fab verify`` runs it against a host.
- A variant this machine cannot run (fp8 weights need a CUDA GPU with fp8 tensor cores) is not
  guessed: it is reported as not measured, with the reason, and the chart says so.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from frontier_runtime.ops.table import CPU, QUANTIZATIONS

from frontier.capacity.explore import Exploration, Option
from frontier.capacity.runtime_process import serve_locally
from frontier.config.schema import PoolSettings, Settings
from frontier.verify import load_set, record_golden, run_set, set_file, write_golden

# The scaled model: heads kept at a multiple of the grouped-query ratio, two layers, a context long
# enough for the verification set's over-long cases to mean something.
SCALED_LAYERS = 2
SCALED_MIN_HEADS = 4
SCALED_MAX_HEADS = 8
SCALED_CONTEXT = 512
# The tokenizer the random checkpoints share is trained to this many tokens (frontier_runtime.tiny).
SCALED_VOCAB = 4096
# Every weight quantization the runtime registers, unquantized first (the reference).
WEIGHTS = tuple(QUANTIZATIONS)


@dataclass(frozen=True)
class Variant:
    quantization: str  # model.quantization: none | int8 | fp8
    kv_cache_dtype: str  # runtime.kv_cache_dtype

    @property
    def label(self) -> str:
        quantized = QUANTIZATIONS[self.quantization].quantized
        weights = "weights " + (self.quantization if quantized else "unquantized")
        return f"{weights}, kv {self.kv_cache_dtype}"


@dataclass(frozen=True)
class VariantQuality:
    variant: Variant
    pass_rate: float | None  # None: not measured (``not_measured`` says why)
    passed: int = 0
    cases: int = 0
    failed: tuple[str, ...] = ()
    not_measured: str = ""


@dataclass(frozen=True)
class QualityRun:
    """What the quality axis was measured on, and each variant's result."""

    shape: dict[str, object]
    weights: str  # "random" or the directory of the stack's own weights
    verify_set: str
    results: tuple[VariantQuality, ...]

    def of(self, quantization: str, kv_cache_dtype: str) -> VariantQuality | None:
        for result in self.results:
            if result.variant == Variant(quantization, kv_cache_dtype):
                return result
        return None


def variants_to_measure(pool: PoolSettings, kv_dtypes: tuple[str, ...]) -> tuple[Variant, ...]:
    """Every weight quantization x every KV cache dtype the exploration sweeps; the reference first."""
    own_kv = pool.runtime.kv_cache_dtype
    ordered_kv = (own_kv, *(kv for kv in kv_dtypes if kv != own_kv))
    return tuple(Variant(q, kv) for q in WEIGHTS for kv in ordered_kv)


def why_not_here(variant: Variant) -> str:
    """Why this machine cannot run ``variant`` (empty when it can)."""
    problem = QUANTIZATIONS[variant.quantization].problem(CPU)
    return f"model.quantization {variant.quantization} {problem}; this machine has none" if problem else ""


def scaled_shape(pool: PoolSettings) -> dict[str, object]:
    """``pool``'s model architecture at a size this machine runs: head_dim, the query:KV head ratio,
    the MLP ratio, tied embeddings and dtype kept; heads, layers and vocabulary scaled down."""
    model = pool.model
    head_dim = model.hidden_size // model.num_attention_heads
    group = model.num_attention_heads // model.num_kv_heads
    heads = max(SCALED_MIN_HEADS, min(SCALED_MAX_HEADS, model.num_attention_heads))
    heads = max(group, heads - heads % group)
    hidden = heads * head_dim
    mlp_ratio = model.intermediate_size / model.hidden_size
    return {
        "hidden_size": hidden,
        "num_layers": SCALED_LAYERS,
        "num_heads": heads,
        "num_kv_heads": heads // group,
        "intermediate_size": max(16, round(hidden * mlp_ratio / 16) * 16),
        "vocab_size": SCALED_VOCAB,
        "max_position_embeddings": SCALED_CONTEXT,
        "tie_word_embeddings": model.tie_word_embeddings,
        "dtype": model.dtype,
    }


def measure(
    settings: Settings,
    pool: PoolSettings,
    variants: tuple[Variant, ...],
    workdir: Path,
    *,
    model_dir: Path | None = None,
    on_progress: Callable[[str], object] = print,
) -> QualityRun:
    """The pass rate of the stack's verification set on ``pool``'s model for each of ``variants`` (the first is the
    reference whose greedy outputs become the golden ones), each on its own runtime process."""
    from frontier_runtime.tiny import make_tiny_checkpoint  # torch: only a measured sweep pays for it

    workdir.mkdir(parents=True, exist_ok=True)
    shape = scaled_shape(pool)
    if model_dir is None:
        on_progress(f"quality: a random checkpoint of {pool.model.name}'s architecture, scaled: {shape}")
        model_dir = make_tiny_checkpoint(workdir / "model", seed=0, **shape)  # type: ignore[arg-type]
        weights = "random"
    else:
        weights = str(model_dir)
    name = pool.model.name
    source = set_file(settings.verify.file)
    set_copy = workdir / "sets" / source.name
    set_copy.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, set_copy)
    # The whole set is checked before any runtime starts.
    recording = load_set(set_copy, model=name, recording=True)

    reference, results = variants[0], []
    for variant in variants:
        why = why_not_here(variant)
        if why:
            on_progress(f"quality: {variant.label}: not measured ({why})")
            results.append(VariantQuality(variant, None, not_measured=why))
            continue
        started = time.monotonic()
        tag = f"runtime-{variant.quantization}-{variant.kv_cache_dtype}"
        with serve_locally(runtime_yaml(pool, variant, model_dir), model_dir, workdir, name=tag) as served:
            url = served.url
            if variant == reference:
                outputs = record_golden(url, None, recording, model=name)
                write_golden(set_copy, name, f"reference ({variant.label})", outputs)
            report = run_set(
                url, None, load_set(set_copy, model=name), model=name, context_tokens=SCALED_CONTEXT
            )
        failed = tuple(r.name for r in report.results if not r.passed)
        results.append(VariantQuality(variant, report.pass_rate, report.passed, len(report.results), failed))
        on_progress(
            f"quality: {variant.label}: pass rate {report.pass_rate:.3f} ({report.passed}/{len(report.results)})"
            f"{' failed: ' + ', '.join(failed) if failed else ''} [{time.monotonic() - started:.0f}s]"
        )
    return QualityRun(shape, weights, str(source), tuple(results))


def runtime_yaml(pool: PoolSettings, variant: Variant, model_dir: Path) -> dict[str, object]:
    """The runtime's config for one variant on this machine's CPU: ``pool``'s model and cache
    settings where they apply to the scaled model, small batches, one thread."""
    return {
        "model": {
            "name": pool.model.name,
            "weights_uri": str(model_dir),
            "dtype": pool.model.dtype,
            "max_seq_len": SCALED_CONTEXT,
            "quantization": variant.quantization,
        },
        "kv_cache_dtype": variant.kv_cache_dtype,
        "block_size": pool.runtime.block_size,
        "prefix_caching": pool.runtime.prefix_caching,
        "max_concurrency": 4,
        "queue": {"max_length": 16, "timeout_ms": 120_000},
        "batch": {"window_ms": 0, "max_batch_size": 4, "max_num_batched_tokens": SCALED_CONTEXT},
        "cpu_kv_cache_bytes": 64 * 1024 * 1024,
        "cpu_threads": 1,
        "drain_timeout_s": 1,
        "log_level": "warning",
        "device": "cpu",
    }


@dataclass(frozen=True)
class QualityPoint:
    """One variant of weights and KV cache on the price-pass-rate chart: its cheapest option meeting
    every SLO (None when none does) and its measured pass rate (None when not measured)."""

    variant: Variant
    option: Option | None
    quality: VariantQuality | None
    on_front: bool = False

    @property
    def pass_rate(self) -> float | None:
        return None if self.quality is None else self.quality.pass_rate


def quality_points(ex: Exploration, run: QualityRun | None) -> tuple[QualityPoint, ...]:
    """Each (weights, KV cache) variant the exploration swept, with its cheapest option and its pass
    rate; the price-pass-rate front marked: no other measured variant is both cheaper and passes more."""
    cheapest: dict[Variant, Option] = {}
    for option in ex.options:
        key = Variant(option.candidate.quantization, option.candidate.kv_cache_dtype)
        if key not in cheapest or option.cost_per_million < cheapest[key].cost_per_million:
            cheapest[key] = option
    swept = sorted(
        {Variant(c.quantization, c.kv_cache_dtype) for c in (o.candidate for o in ex.options)}
        | ({r.variant for r in run.results} if run else set()),
        key=lambda v: (WEIGHTS.index(v.quantization) if v.quantization in WEIGHTS else 99, v.kv_cache_dtype),
    )
    points = [
        QualityPoint(v, cheapest.get(v), run.of(v.quantization, v.kv_cache_dtype) if run else None)
        for v in swept
    ]
    ranked = sorted(
        (p for p in points if p.option is not None and p.pass_rate is not None),
        key=lambda p: (p.option.cost_per_million if p.option else 0.0, -(p.pass_rate or 0.0)),
    )
    front, best = set(), -1.0
    for point in ranked:
        if point.pass_rate is not None and point.pass_rate > best:
            front.add(point.variant)
            best = point.pass_rate
    return tuple(QualityPoint(p.variant, p.option, p.quality, p.variant in front) for p in points)
