"""`fab render` and `fab plan`, run through Fabric's own command-line program (in process)."""

from __future__ import annotations

import hashlib

import pytest
from fab_program import fab

from frontier import project
from frontier.capacity.baseline import Baseline, save_baseline
from frontier.render.stack import render_stack
from frontier.targets import load_stack

DIGEST = "sha256:" + "ab" * 32


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch, stacks_copy):
    monkeypatch.chdir(project.root())
    monkeypatch.setenv("FRONTIER_STACKS_DIR", str(stacks_copy))
    monkeypatch.delenv("FRONTIER_STACK", raising=False)


def test_render_writes_every_file_and_lists_it(capsys, tmp_path):
    code, out, _ = fab(capsys, "render", "-s", "prod", "--out", str(tmp_path), "--digest", DIGEST)
    assert code == 0
    expected = render_stack(load_stack("prod"), DIGEST)
    for rel, text in expected.items():
        assert (tmp_path / rel).read_text() == text
        assert rel in out
        assert f"{len(text.encode()):,}" in out
        assert hashlib.sha256(text.encode()).hexdigest()[:12] in out
    assert f"image: 123456789012.dkr.ecr.us-east-1.amazonaws.com/frontier-runtime-prod@{DIGEST}" in out
    assert "warning" not in out


def test_render_twice_gives_the_same_bytes(capsys, tmp_path):
    fab(capsys, "render", "-s", "local", "--out", str(tmp_path / "a"), "--digest", DIGEST)
    fab(capsys, "render", "-s", "local", "--out", str(tmp_path / "b"), "--digest", DIGEST)
    files_a = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*") if p.is_file())
    assert files_a == files_b
    for rel in files_a:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()


def test_rendered_driver_script_is_executable(capsys, tmp_path):
    fab(capsys, "render", "-s", "prod", "--out", str(tmp_path), "--digest", DIGEST)
    assert (tmp_path / "drivers/h100/install-nvidia.sh").stat().st_mode & 0o111


def test_render_without_a_digest_warns_that_the_unit_is_a_placeholder(capsys, tmp_path):
    code, out, _ = fab(capsys, "render", "-s", "prod", "--out", str(tmp_path))
    assert code == 0
    assert "warning: no --digest given" in out and "NOT deployable" in out
    assert "NOT deployable" in (tmp_path / "release/frontier-runtime.service").read_text()


def test_render_refuses_a_mutable_tag(capsys, tmp_path):
    out = tmp_path / "out"
    code, _, err = fab(capsys, "render", "-s", "prod", "--out", str(out), "--digest", "latest")
    assert code == 2
    assert "digest 'latest' is not an immutable digest" in err
    assert not out.exists()


def test_render_of_a_bad_stack_exits_non_zero_and_writes_nothing(
    capsys, tmp_path, stacks_copy, changed_stack
):
    changed_stack("local", {"runtime.batch.max_batch_size": 32})
    out = tmp_path / "out"
    code, _, err = fab(capsys, "render", "-s", "local", "--out", str(out))
    assert code == 2
    assert "runtime.batch.max_batch_size = 32: must be <= runtime.max_concurrency (16)" in err
    assert not out.exists()


def test_render_defaults_to_the_stack_in_the_environment(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("FRONTIER_STACK", "staging")
    code, out, _ = fab(capsys, "render", "--out", str(tmp_path), "--digest", DIGEST)
    assert code == 0
    assert "rendered stack staging" in out
    assert (tmp_path / "cloud-init/l40s.yaml").exists()


def test_plan_prints_memory_and_capacity_tables_per_node_group(capsys):
    code, out, _ = fab(capsys, "plan", "--stack", "prod")
    assert code == 0
    for line in (
        "node group h100: memory of one GPU",
        "weights per GPU",
        "17.64 GB",
        "327,680 B",
        "40,960 B",
        "1,229,530 tokens",
        "node group h100: replicas, nodes and cost",
        "$589.92",
        "$6.50",
        "rollout.max_surge = 1",
    ):
        assert line in out, line
    assert "ASSUMPTION" in out


def test_plan_uses_the_measured_baseline_when_there_is_one(capsys):
    save_baseline(
        Baseline(
            stack="prod",
            measured_at="2026-11-30T10:00:00Z",
            replica_qps=20.0,
            output_tokens_per_s=7000.0,
            p50_latency_ms=900.0,
            p99_latency_ms=4000.0,
            ttft_p99_ms=700.0,
            hosts_measured=2,
            release_id="r-abc123",
        )
    )
    code, out, _ = fab(capsys, "plan", "-s", "prod")
    assert code == 0
    assert "measured baseline (2026-11-30T10:00:00Z, release r-abc123" in out
    assert "ASSUMPTION" not in out
    assert "$393.28" in out  # 4 nodes x $98.32


def test_plan_of_an_unknown_stack_names_the_known_ones(capsys):
    code, _, err = fab(capsys, "plan", "-s", "qa")
    assert code == 2
    assert (
        "known stacks: dev, eks-gateway, eks-multinode, eks-prod, local, moe-prod, prod, prod-multinode, staging"
        in err
    )
