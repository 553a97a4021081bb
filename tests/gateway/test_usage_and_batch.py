"""``fab usage`` sums metering records with the planner's price; ``fab batch`` runs a Batch file
through a real gateway and survives SIGKILL half-way with exactly one result per input line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from frontier_gateway.metering import MeterRecord

from frontier.access.usage import output_token_prices, read_records, sum_usage
from frontier.targets import load_stack
from tests.gateway.harness import StandIn, gateway_config, running_gateway, tenant
from tests.gateway.stacks import two_model_config, write_stack

FAB = str(Path(sys.executable).with_name("fab"))
KEY = "sk-nightly-0123456789"


@pytest.fixture
def stack_dir(tmp_path: Path) -> Path:
    document = two_model_config()
    document["config"]["frontier:gateway"]["metering"] = {"uri": str(tmp_path / "metering.jsonl")}
    write_stack(tmp_path / "stacks", document)
    return tmp_path / "stacks"


def _record(tenant: str, model: str, prompt: int, completion: int, status: int = 200) -> str:
    record = MeterRecord(
        time.time(),
        "r",
        tenant,
        model,
        "interactive",
        status,
        prompt,
        completion,
        120.0,
        20.0,
        True,
        "http://x",
    )
    return record.to_line()


def _fab(*args: str, stack_dir: Path, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "FRONTIER_STACKS_DIR": str(stack_dir), "FRONTIER_STACK": "", **env}
    return subprocess.run([FAB, *args], capture_output=True, text=True, env=full_env, timeout=120)


def test_usage_sums_records_per_tenant_and_model_with_cost(
    stack_dir: Path, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("FRONTIER_STACKS_DIR", str(stack_dir))  # the same stack (and no baseline) as fab's
    lines = [
        _record("acme", "tiny-llama", 10, 20),
        _record("acme", "tiny-llama", 5, 30),
        _record("acme", "tiny-llama-small", 7, 8, status=503),
        _record("nightly", "tiny-llama-small", 100, 1000),
    ]
    (tmp_path / "metering.jsonl").write_text(
        "\n".join(lines) + '\n{"tenant": "acme", "mod'
    )  # a torn last line
    settings = load_stack("local", path=stack_dir / "Pulumi.local.yaml")
    prices = output_token_prices(settings)
    assert set(prices) == {"tiny-llama", "tiny-llama-small"} and all(p > 0 for p in prices.values())
    found = read_records(str(tmp_path / "metering.jsonl"))
    assert len(found.records) == 4 and len(found.skipped) == 1
    rows = {(r.tenant, r.model): r for r in sum_usage(found.records, prices)}
    assert (rows["acme", "tiny-llama"].requests, rows["acme", "tiny-llama"].completion_tokens) == (2, 50)
    assert rows["acme", "tiny-llama-small"].errors == 1
    assert rows["nightly", "tiny-llama-small"].cost_usd == pytest.approx(1000 * prices["tiny-llama-small"])

    done = _fab("usage", "-s", "local", stack_dir=stack_dir)
    assert done.returncode == 0, done.stderr
    assert "nightly" in done.stdout and "tiny-llama-small" in done.stdout and "1,000" in done.stdout
    assert "1 line(s) were not records" in done.stdout
    total = 50 * prices["tiny-llama"] + 1008 * prices["tiny-llama-small"]
    assert done.stdout.strip().splitlines()[-1] == f"usage: records=4 tenants=2 models=2 cost_usd={total:.6f}"


def test_usage_of_a_stack_without_gateway_says_why(tmp_path: Path) -> None:
    done = _fab("usage", "-s", "dev", stack_dir=Path(__file__).resolve().parents[2] / "stacks")
    assert done.returncode != 0 and "has no gateway, so nothing is metered" in done.stderr


def _batch_input(path: Path, n: int, bad_line: int) -> None:
    lines = []
    for i in range(1, n + 1):
        if i == bad_line:
            lines.append('{"custom_id": "req-bad", "method": "POST", "url": "/v1/completions", "body": ')
            continue
        body = {"prompt": f"request {i}", "max_tokens": 3}
        lines.append(
            json.dumps({"custom_id": f"req-{i}", "method": "POST", "url": "/v1/completions", "body": body})
        )
    path.write_text("\n".join(lines) + "\n")


def test_batch_killed_half_way_resumes_with_exactly_one_result_per_line(
    stack_dir: Path, tmp_path: Path
) -> None:
    upstream = StandIn("small")
    upstream.delay_s = 0.1  # 40 requests at concurrency 4: about a second of work
    config = gateway_config(
        {"tiny-llama-small": [upstream.url]},
        [tenant("nightly", KEY, ["tiny-llama-small"], priority="batch")],
        tmp_path / "gw-metering.jsonl",
    )
    source, output = tmp_path / "requests.jsonl", tmp_path / "results.jsonl"
    _batch_input(source, 40, bad_line=7)
    args = [
        "batch",
        "-s",
        "local",
        "--model",
        "tiny-llama-small",
        "--input",
        str(source),
        "--output",
        str(output),
        "--concurrency",
        "4",
    ]
    try:
        with running_gateway(config) as gw:
            env = {
                **os.environ,
                "FRONTIER_STACKS_DIR": str(stack_dir),
                "FRONTIER_STACK": "",
                "FRONTIER_API_KEY": KEY,
            }
            first = subprocess.Popen(
                [FAB, *args, "--url", gw.url],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
            )
            deadline = time.monotonic() + 60
            while not output.exists() or output.read_text().count("\n") < 15:
                assert time.monotonic() < deadline and first.poll() is None, "the batch never got half-way"
                time.sleep(0.02)
            first.send_signal(signal.SIGKILL)
            first.wait()
            written = output.read_text().count("\n")
            assert 15 <= written < 40
            second = subprocess.run(
                [FAB, *args, "--url", gw.url], capture_output=True, text=True, env=env, timeout=120
            )
    finally:
        upstream.close()
    assert second.returncode == 0, second.stdout + second.stderr
    results = [json.loads(line) for line in output.read_text().splitlines()]
    assert sorted(r["line"] for r in results) == list(range(1, 41))  # exactly one result per input line
    bad = next(r for r in results if r["line"] == 7)
    assert bad["error"]["code"] == "invalid_line" and bad["error"]["message"].startswith(
        "line 7: not valid JSON"
    )
    good = [r for r in results if r["line"] != 7]
    assert all(r["response"]["status_code"] == 200 and r["custom_id"] == f"req-{r['line']}" for r in good)
    assert all(
        body["priority"] == "batch" and body["model"] == "tiny-llama-small"
        for _, body, _ in upstream.requests
    )
    # At most the requests in flight at the kill were sent twice; every result was written once.
    sent = Counter(body["prompt"] for _, body, _ in upstream.requests)
    assert len(sent) == 39 and sum(sent.values()) - 39 <= 4
    assert f"done_before={written - 1}" in second.stdout.splitlines()[-1]
    assert "results=40" in second.stdout.splitlines()[-1]


def test_batch_refuses_an_unknown_model_and_names_the_served_ones(stack_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "requests.jsonl"
    _batch_input(source, 2, bad_line=0)
    done = _fab(
        "batch",
        "-s",
        "local",
        "--model",
        "gpt-4",
        "--input",
        str(source),
        "--output",
        str(tmp_path / "o.jsonl"),
        stack_dir=stack_dir,
    )
    assert done.returncode == 2
    assert (
        "model 'gpt-4' is not served by stack 'local': it serves tiny-llama, tiny-llama-small" in done.stderr
    )
