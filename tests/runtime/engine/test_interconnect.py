"""A replica over several ranks measures its links before it loads: all-reduce bus bandwidth as
nccl-tests reports it, over the replica's own process group (gloo here, NCCL on GPU hosts), and a
figure below ``min_bus_gbps`` refuses the replica on every rank alike."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import pytest
import torch
from frontier_runtime import interconnect
from frontier_runtime.distributed import free_tcp_port, init_group
from frontier_runtime.engine.llm_engine import LLMEngine

PROBE = 4 * 2**20


def _measure(rank: int, init_method: str, floor: float, results: mp.Queue) -> None:
    torch.set_num_threads(1)
    init_group(rank, 2, init_method, torch.device("cpu"), timeout_s=60)
    try:
        results.put((rank, interconnect.check(torch.device("cpu"), floor, probe_bytes=PROBE)))
    except interconnect.InterconnectTooSlow as refused:
        results.put((rank, str(refused)))


def on_two_ranks(floor: float) -> dict[int, object]:
    context = mp.get_context("spawn")
    results = context.Queue()
    init_method = f"tcp://127.0.0.1:{free_tcp_port()}"
    ranks = [context.Process(target=_measure, args=(r, init_method, floor, results)) for r in range(2)]
    for process in ranks:
        process.start()
    found = dict(results.get(timeout=120) for _ in ranks)
    for process in ranks:
        process.join(timeout=30)
    return found


def test_nccl_tests_bus_bandwidth_is_the_algorithm_bandwidth_times_2_n_minus_1_over_n():
    assert interconnect.bus_gbps(2 * 10**9, 2, 1.0) == pytest.approx(2.0)
    assert interconnect.bus_gbps(8 * 10**9, 8, 2.0) == pytest.approx(4 * 2 * 7 / 8)


def test_two_gloo_ranks_agree_on_one_figure():
    found = on_two_ranks(floor=0)
    first, second = found[0], found[1]
    assert isinstance(first, interconnect.Interconnect) and first == second
    assert (first.backend, first.ranks, first.probe_bytes) == ("gloo", 2, PROBE)
    assert first.bus_gbps > 0


def test_links_slower_than_min_bus_gbps_refuse_the_replica_on_every_rank():
    found = on_two_ranks(floor=1e5)
    assert all(isinstance(line, str) and "below runtime.min_bus_gbps = 100000" in line for line in found.values())


def test_an_engine_over_two_ranks_reports_its_links_and_refuses_below_the_floor(tied_dir: Path) -> None:
    engine = LLMEngine(tied_dir, tensor_parallel_size=2, num_blocks=64)
    try:
        assert engine.stats().interconnect_bus_gbps > 0
    finally:
        engine.shutdown()
    with pytest.raises(interconnect.InterconnectTooSlow, match="runtime.min_bus_gbps"):
        LLMEngine(tied_dir, tensor_parallel_size=2, num_blocks=64, min_bus_gbps=1e5)


def test_one_rank_measures_nothing(tied_dir: Path) -> None:
    engine = LLMEngine(tied_dir, num_blocks=64, min_bus_gbps=1e5)
    try:
        assert engine.stats().interconnect_bus_gbps == 0
    finally:
        engine.shutdown()
