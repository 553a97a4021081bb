"""Scale from zero on the local stack: a pool at zero hosts holds its requests in the gateway, the local
autoscaler launches a slot on that demand at once, every request is answered, and the pool goes
back to zero once idle — real sshd, HAProxy, moto, the gateway and runtime processes.

One host slot (127.0.2.2), ``min_size: 0`` with a small ``idle_to_zero_s``, the gateway's hold queue
for the model, and the autoscaler scraping every 0.3 s.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from frontier.demo import zero
from frontier.targets import load_stack
from frontier.targets.local import cluster as local
from frontier.targets.local import gateway as local_gateway
from tests.e2e.deployed import up_with_first_release
from tests.e2e.stackcopy import free_port, write_local_stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REQUESTS = 4


def _zero_stack(root: Path) -> Path:
    """The local stack on one slot, allowed to reach zero, with a gateway holding its requests."""
    stacks = write_local_stack(root, hosts=1)
    path = stacks / "Pulumi.local.yaml"
    document = yaml.safe_load(path.read_text())
    config = document["config"]
    model = config["frontier:model"]["name"]
    config["frontier:node_groups"][0].update(min_size=0, desired_size=1, max_size=1, idle_to_zero_s=3)
    # A cold start on a busy two-core machine can take a minute: room for it in the hold.
    config["frontier:edge"]["idle_timeout_s"] = 300
    config["frontier:rollout"]["readiness_timeout_s"] = 180
    config["frontier:local"]["autoscaler"] = {"interval_s": 0.3, "cooldown_s": 1}
    config["frontier:gateway"] = {
        "port": free_port(),
        "admin_port": free_port(),
        "metering": {"uri": str(root / "metering.jsonl"), "flush_s": 1},
        "probe": {"interval_s": 0.3, "timeout_s": 1},
        "hold": {model: {"max_requests": 16, "timeout_s": 170}},
    }
    config["frontier:tenants"] = [
        {
            "name": "acme",
            "api_key_secret": "frontier/local/tenants/acme",
            "models": [model],
            "requests_per_minute": 600,
            "tokens_per_minute": 200_000,
            "max_concurrent_requests": 16,
            "priority": "interactive",
        }
    ]
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return stacks


def test_a_pool_at_zero_answers_every_held_request_then_goes_back_to_zero(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FRONTIER_STACKS_DIR", str(_zero_stack(tmp_path)))
    monkeypatch.delenv(local.CONNECTION_ENV, raising=False)
    settings = load_stack("local")
    try:
        up_with_first_release(settings, tmp_path)
        local_gateway.start(settings)

        run = zero.scale_from_zero(
            settings,
            settings.model.name,
            gateway_url=local_gateway.gateway_url(settings),
            key=local_gateway.tenant_key(settings, "acme"),
            requests=REQUESTS,
            say=lambda line: None,
        )
    finally:
        local_gateway.stop(settings)
        local.down(settings)
    with capsys.disabled():
        print(
            f"\n  from zero: {len(run.samples)} requests, {run.failed} failed, first TTFT {run.first_ttft_s}s; "
            f"launch {run.launch_s}s; back to zero {run.back_to_zero_s:.1f}s after the last answer; "
            f"decisions: {run.decisions}"
        )
    assert len(run.samples) == REQUESTS
    log = local.state_dir(settings) / "gateway" / "gateway.log"
    assert run.failed == 0, (
        [s.error for s in run.samples],
        run.decisions,
        run.launch_s,
        log.read_text()[-3000:],
    )
    assert [d.split(":")[0] for d in run.decisions] == ["0 → 1", "1 → 0"]
    assert "held by the gateway for a pool at zero" in run.decisions[0]
    assert "idle_to_zero_s 3" in run.decisions[1]
