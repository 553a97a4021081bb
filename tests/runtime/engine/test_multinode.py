"""A replica over two nodes: the leader (rank 0, here the test's own engine) and a second node
(``python -m frontier_runtime node``, a real process tree) on two loopback addresses, joined through
the leader's step port with the replica's key, giving the outputs one node gives.

What only two machines can show (a NIC between them, NCCL over EFA, a node powered off so no FIN
comes) is not here; a node that vanishes without closing anything is covered by the watchdog's
heartbeat test with a connection that goes silent.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing import Pipe
from multiprocessing.connection import Listener
from pathlib import Path

import pytest
from engine_fixtures import Reference
from frontier_hostside import names
from frontier_runtime.config import parse_config
from frontier_runtime.distributed import free_tcp_port
from frontier_runtime.engine.config import EngineConfig
from frontier_runtime.engine.llm_engine import LLMEngine
from frontier_runtime.engine.nodes import Heartbeat, NodeRole, ReplicaError, Watchdog
from frontier_runtime.requests import SamplingParams

pytestmark = pytest.mark.e2e

LEADER = "127.0.0.2"  # the second node dials this address; the leader listens on it alone
KEY = "replica-key-for-tests-0123456789"
GREEDY = SamplingParams(max_tokens=24, temperature=0.0)


def runtime_yaml(model_dir: Path, tmp_path: Path, **extra: object) -> Path:
    lines = [
        f"model: {{name: tiny, weights_uri: {model_dir}, dtype: float32, max_seq_len: 256}}",
        "batch: {max_batch_size: 8, max_num_batched_tokens: 256}",
        "tensor_parallel_size: 2",
        "nodes_per_replica: 2",
        "device: cpu",
        *(f"{k}: {v}" for k, v in extra.items()),
    ]
    path = tmp_path / "runtime.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def replica_env(port: int, node_rank: int, key: str = KEY, join_timeout_s: int = 120) -> dict[str, str]:
    return {
        names.NODE_RANK_ENV: str(node_rank),
        names.LEADER_ADDRESS_ENV: LEADER,
        names.REPLICA_KEY_ENV: key,
        names.REPLICA_PORT_ENV: str(port),
        names.REPLICA_JOIN_TIMEOUT_ENV: str(join_timeout_s),
    }


def free_port_pair() -> int:
    """A port whose successor (the store port) is free too."""
    for _ in range(50):
        port = free_tcp_port(LEADER)
        try:
            with Listener((LEADER, port + 1)):
                return port
        except OSError:
            continue
    raise RuntimeError("no two free consecutive ports")


@contextmanager
def second_node(config: Path, model_dir: Path, env: dict[str, str]) -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "frontier_runtime", names.NODE_COMMAND, "--config", str(config)]
        + ["--model-dir", str(model_dir)],
        env={**os.environ, **env, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its ranks too: a kill of the group is a node going away
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


@contextmanager
def leader_engine(config: Path, model_dir: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    engine = LLMEngine.from_config(parse_config(config.read_text()), model_dir)
    try:
        yield engine
    finally:
        engine.shutdown()


def wait_for(predicate, timeout_s: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout_s} s")
        time.sleep(0.1)


def test_two_nodes_equal_one_node(
    tied_ref: Reference, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = runtime_yaml(tied_ref.model_dir, tmp_path)
    port = free_port_pair()
    with second_node(config, tied_ref.model_dir, replica_env(port, 1)) as node:
        with leader_engine(config, tied_ref.model_dir, replica_env(port, 0), monkeypatch) as engine:
            assert engine.workers.processes == []  # rank 1 lives on the other node
            outs = engine.generate(tied_ref.prompts, GREEDY)
        # The leader's shutdown tells the other node's rank to stop; the node then exits for a restart.
        assert node.wait(30) == names.EXIT_NODE_LOST
    assert outs == tied_ref.outputs


@pytest.mark.slow
def test_two_nodes_of_a_pipeline_stage_each_equal_one_node(
    gqa_ref: Reference, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # PP=2 x TP=2 over two nodes: each node holds a whole stage (two ranks of its own, one GPU
    # each on a GPU host), so only the stage boundary crosses between the nodes.
    config = runtime_yaml(gqa_ref.model_dir, tmp_path, pipeline_parallel_size=2)
    port = free_port_pair()
    with second_node(config, gqa_ref.model_dir, replica_env(port, 1)) as node:
        with leader_engine(config, gqa_ref.model_dir, replica_env(port, 0), monkeypatch) as engine:
            assert [p.name for p in engine.workers.processes] == ["frontier-rank1"]
            assert list(engine.runner.model.layer_ids) == [0, 1]
            outs = engine.generate(gqa_ref.prompts, GREEDY)
        out, _ = node.communicate(timeout=30)
        assert node.returncode == names.EXIT_NODE_LOST, out
    assert outs == gqa_ref.outputs


def test_a_killed_node_takes_the_replica_out_and_fails_its_requests(
    tied_ref: Reference, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from frontier_runtime.engine.api import EngineDeadError
    from frontier_runtime.engine.loop import AsyncEngine

    config = runtime_yaml(tied_ref.model_dir, tmp_path)
    port = free_port_pair()
    with (
        second_node(config, tied_ref.model_dir, replica_env(port, 1)) as node,
        leader_engine(config, tied_ref.model_dir, replica_env(port, 0), monkeypatch) as engine,
    ):
        loop = AsyncEngine(engine)
        loop.warmup()
        assert loop.is_running
        os.killpg(node.pid, signal.SIGKILL)  # the node goes away: its processes, its sockets
        wait_for(lambda: not loop.is_running, 15, "the engine stopping")
        assert "rank 1" in (loop.replica_lost or "")
        with pytest.raises(EngineDeadError, match="lost a rank"):
            loop.warmup(timeout_s=5)


def test_a_node_whose_leader_is_gone_exits_for_a_restart(
    tied_ref: Reference, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = runtime_yaml(tied_ref.model_dir, tmp_path)
    port = free_port_pair()
    with (
        second_node(config, tied_ref.model_dir, replica_env(port, 1)) as node,
        leader_engine(config, tied_ref.model_dir, replica_env(port, 0), monkeypatch) as engine,
    ):
        engine.generate(tied_ref.prompts[:1], GREEDY)
        engine.workers.terminate()  # rank 0's connections close as if its process died
        assert node.wait(30) == names.EXIT_NODE_LOST


def test_a_node_with_another_key_is_refused_naming_the_key(tied_ref: Reference, tmp_path: Path) -> None:
    config = runtime_yaml(tied_ref.model_dir, tmp_path)
    port = free_port_pair()
    with Listener((LEADER, port), authkey=KEY.encode()) as door:  # a leader's door, nothing behind it
        env = replica_env(port, 1, key="another-key-of-another-replica")
        with second_node(config, tied_ref.model_dir, env) as node:
            with pytest.raises(Exception):  # noqa: B017, PT011 - the handshake fails on this end too
                door.accept()
            out, _ = node.communicate(timeout=60)
    assert node.returncode != 0 and names.REPLICA_KEY_ENV in out


def test_a_node_of_another_release_is_refused_naming_the_setting(
    tied_ref: Reference, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    leader_config = runtime_yaml(tied_ref.model_dir, tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    node_config = runtime_yaml(tied_ref.model_dir, other, block_size=32)
    port = free_port_pair()
    with second_node(node_config, tied_ref.model_dir, replica_env(port, 1)) as node:
        leader_env = replica_env(port, 0, join_timeout_s=10)
        with (
            pytest.raises(ReplicaError, match="did not join"),
            leader_engine(leader_config, tied_ref.model_dir, leader_env, monkeypatch),
        ):
            pass
        out, _ = node.communicate(timeout=60)
    assert node.returncode != 0
    assert "block_size: leader 16, rank 32" in out


def test_a_leader_whose_node_never_comes_fails_its_start_naming_the_node(
    tied_ref: Reference, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = runtime_yaml(tied_ref.model_dir, tmp_path)
    env = replica_env(free_port_pair(), 0, join_timeout_s=2)
    with (
        pytest.raises(ReplicaError, match=r"node 1 \(ranks 1\) did not join within 2 s"),
        leader_engine(config, tied_ref.model_dir, env, monkeypatch),
    ):
        pass


# -- the rules, before anything starts ------------------------------------------------------------


def test_nodes_that_do_not_split_the_ranks_are_refused(tied_ref: Reference) -> None:
    with pytest.raises(ValueError, match=r"nodes_per_replica.*must divide the replica's 2 ranks"):
        EngineConfig(tied_ref.model_dir, tensor_parallel_size=2, nodes_per_replica=4)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({names.NODE_RANK_ENV: "2"}, "must be a node of this replica, 0..1"),
        ({names.REPLICA_KEY_ENV: "short"}, "at least 16 characters"),
        ({names.NODE_RANK_ENV: "1", names.LEADER_ADDRESS_ENV: ""}, "needs FRONTIER_LEADER_ADDRESS"),
        (
            {names.REPLICA_PORT_ENV: "70000"},
            r"FRONTIER_REPLICA_PORT='70000': must be an integer within 1..65534",
        ),
    ],
)
def test_a_role_the_environment_gets_wrong_is_refused_naming_the_variable(env: dict, message: str) -> None:
    good = {names.REPLICA_KEY_ENV: KEY, names.LEADER_ADDRESS_ENV: LEADER}
    with pytest.raises(ReplicaError, match=message):
        NodeRole.from_env(2, {**good, **env})


def test_a_rank_that_goes_silent_is_lost_after_the_silence_limit() -> None:
    # A node powered off sends no FIN: its connection stays open and simply goes quiet.
    leader_end, rank_end = Pipe(duplex=True)
    lost: list[str] = []
    started = time.monotonic()
    watchdog = Watchdog({3: leader_end}, [], lost.append, silent_after_s=2.0)
    try:
        wait_for(lambda: bool(lost), 10, "the silent rank being reported")
    finally:
        watchdog.stop()
        rank_end.close()
    assert 2.0 <= time.monotonic() - started < 6.0
    assert len(lost) == 1 and "rank 3 sent no heartbeat" in lost[0]


def test_a_rank_that_beats_is_not_lost() -> None:
    leader_end, rank_end = Pipe(duplex=True)
    lost: list[str] = []
    beat = Heartbeat(rank_end)
    watchdog = Watchdog({3: leader_end}, [], lost.append, silent_after_s=2.0)
    time.sleep(4.0)
    watchdog.stop()
    beat.stop()
    assert lost == []


def test_the_leaders_server_answers_503_and_exits_for_a_restart_when_a_node_is_lost(
    tied_ref: Reference, tmp_path: Path
) -> None:
    import httpx

    config = runtime_yaml(tied_ref.model_dir, tmp_path)
    port, http_port = free_port_pair(), free_tcp_port()
    base = f"http://127.0.0.1:{http_port}"
    with second_node(config, tied_ref.model_dir, replica_env(port, 1)) as node:
        leader = subprocess.Popen(
            [sys.executable, "-m", "frontier_runtime", "serve", "--config", str(config)]
            + ["--host", "127.0.0.1", "--port", str(http_port), "--model-dir", str(tied_ref.model_dir)],
            env={**os.environ, **replica_env(port, 0), "OMP_NUM_THREADS": "1"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_for(lambda: _status(base + names.READINESS_PATH) == 200, 90, "the replica becoming ready")
            body = {"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0}
            assert httpx.post(base + "/v1/completions", json=body, timeout=30).status_code == 200
            os.killpg(node.pid, signal.SIGKILL)
            answers = []
            deadline = time.monotonic() + 10
            while leader.poll() is None and time.monotonic() < deadline:
                answers.append(_status(base + names.READINESS_PATH))
                time.sleep(0.05)
            assert leader.wait(20) == names.EXIT_NODE_LOST
        finally:
            if leader.poll() is None:
                leader.kill()
            stderr = leader.communicate(timeout=10)[1]
    assert 503 in answers and 200 not in answers[answers.index(503) :]  # out of service, and stays so
    assert "the replica lost a rank" in stderr


def _status(url: str) -> int:
    import httpx

    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return 0
