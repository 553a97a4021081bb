"""/metrics names the attention backend and kernels the engine runs on."""

from __future__ import annotations

from frontier_hostside import names
from frontier_runtime.engine.api import EngineStats
from frontier_runtime.server.metrics import ServerMetrics
from prometheus_client.parser import text_string_to_metric_families


def _info_samples(stats: EngineStats | None) -> list:
    metrics = ServerMetrics("tiny", lambda: stats, lambda: (0, 0), lambda: (True, False))
    families = {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}
    return families[names.ENGINE_INFO_METRIC].samples


def test_the_engine_info_gauge_is_labelled_with_the_attention_backend_and_kernels() -> None:
    stats = EngineStats(0, 0, 1, 1, 0, 0, 0, 0, 0, 0, attention_backend="sdpa-gather", kernels="torch")
    [sample] = _info_samples(stats)
    assert sample.value == 1.0
    assert sample.labels == {
        names.MODEL_LABEL: "tiny",
        names.ATTENTION_BACKEND_LABEL: "sdpa-gather",
        names.KERNELS_LABEL: "torch",
    }


def test_before_the_engine_loads_the_engine_info_family_has_no_sample() -> None:
    assert _info_samples(None) == []
