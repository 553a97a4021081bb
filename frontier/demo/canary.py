"""The demo's canary that answers wrongly: a release that serves without an error but no longer
gives release A's answers is stopped at its canary by the verification set and rolled back.

Release C changes one setting, ``kv_cache_dtype: fp8``. Its runtimes start, pass readiness and the
metric gate; the canary's verification (``rollout.verify_canary``) then compares its greedy outputs
with those recorded from release A and finds them different, so the rollout restores the canary
and the history names the cases that failed. Clients under load see no error throughout.
"""

from __future__ import annotations

import time
from pathlib import Path

from frontier import project
from frontier.config.schema import Settings
from frontier.demo.variants import load_variant, stack_document
from frontier.loadtest.client import BackgroundLoad, RequestSample, Target
from frontier.rollout.deploy import deploy
from frontier.rollout.recordings import store_recording
from frontier.rollout.rolling import RolloutFailed, RolloutResult
from frontier.targets import backend_for
from frontier.targets.local import cluster as local
from frontier.verify import read_set, record_golden

CANARY_SET = "stacks/verify/canary.yaml"


def record_release_a(settings: Settings, model: str, release_a: str) -> Path:
    """Release A's greedy outputs of the canary set for ``model``, kept in the stack's history beside
    release A (what ``fab verify --record`` does); returns the set's path."""
    path = project.root() / CANARY_SET
    outputs = record_golden(
        local.balancer_url(settings),
        local.api_key(settings, settings.pool(model)),
        read_set(path, model=model, golden=None),
        model=model,
    )
    store_recording(
        backend_for(settings).history_store(), path, model=model, release=release_a, outputs=outputs
    )
    return path


def variant_c(settings: Settings, set_path: Path) -> Settings:
    """Release C's settings: an fp8 KV cache, and a canary that must reproduce release A's answers."""
    document = stack_document(settings)
    config = document["config"]
    config["frontier:runtime"]["kv_cache_dtype"] = "fp8"
    config["frontier:rollout"]["verify_canary"] = True
    config["frontier:verify"] = {"file": str(set_path)}
    return load_variant(
        settings,
        document,
        local.state_dir(settings) / "demo" / "c" / Path(settings.source).name,
        "Release C of the demo: release A with an fp8 KV cache, its canary verified (frontier/demo/canary.py).",
    )


def wrong_answers_rolled_back(
    settings: Settings, digest: str, release_a: str, target: Target, rate: float, reporter
) -> tuple[RolloutResult, list[RequestSample], str]:
    """Deploy release C under load; its canary fails verification and is restored. Returns the
    rollout's result, the client samples and the history record's reason."""
    set_path = record_release_a(settings, target.model, release_a)
    settings_c = variant_c(settings, set_path)
    load = BackgroundLoad(target, rate, seed=3).start()
    time.sleep(1.5)  # the load is flowing before the canary drains
    try:
        try:
            result = deploy(backend_for(settings_c), digest, reporter=reporter)
        except RolloutFailed as failure:
            result = failure.result
    finally:
        samples = load.stop()
    reason = backend_for(settings).history_store().records()[-1].get("reason", "")
    return result, samples, reason
