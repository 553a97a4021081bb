"""Pinned CPU engines: each intra-op thread of a rank runs on a core of the rank's own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from engine_fixtures import needs_native_kernels
from frontier_runtime.engine.affinity import rank_cores

ALLOWED = sorted(os.sched_getaffinity(0))


def test_ranks_take_disjoint_slices_of_the_allowed_cores() -> None:
    slices = [rank_cores(rank, 1) for rank in range(len(ALLOWED))]
    assert slices == [[core] for core in ALLOWED]


def test_more_threads_than_cores_is_refused_with_the_numbers() -> None:
    with pytest.raises(
        ValueError, match=rf"rank 0 needs {len(ALLOWED) + 1} cores .* may run on {len(ALLOWED)}"
    ):
        rank_cores(0, len(ALLOWED) + 1)


PROBE = textwrap.dedent(
    """
    import json, os, sys, torch
    from frontier_runtime.engine.affinity import bind_intra_op_threads
    torch.set_num_threads(int(sys.argv[1]))
    torch.ones(1 << 16).sum()  # start the pool
    cores = bind_intra_op_threads(0)
    pins = []
    for task in os.listdir("/proc/self/task"):
        pins.append(sorted(os.sched_getaffinity(int(task))))
    print(json.dumps({"cores": cores, "main": sorted(os.sched_getaffinity(0)), "pins": pins}))
    """
)


@needs_native_kernels  # the binding is a call into the kernels' library
def test_binding_pins_the_calling_thread_and_each_pool_thread_to_its_core() -> None:
    threads = min(2, len(ALLOWED))
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(threads)], capture_output=True, text=True, check=True
    )
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["cores"] == ALLOWED[:threads]
    assert got["main"] == [ALLOWED[0]]
    for core in got["cores"]:
        assert [core] in got["pins"]  # one thread pinned there
