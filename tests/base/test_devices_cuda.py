"""CUDA tensors between real processes (marked ``cuda``: they skip, saying so, on a machine without a GPU).

Two processes share ``cuda:0``, which is what a device map from ``cuda:0`` to
``cuda:0`` covers on a one-GPU machine, and what CUDA IPC reaches. Each run
that could abort a process (an empty tensor through a map) runs in a process
of its own, so that one abort cannot hide another.
"""

from __future__ import annotations

import sys

import pytest
from _mp import REPO, run_argv, run_script

pytestmark = [pytest.mark.cuda, pytest.mark.multiprocess]

TOLD = [[float(k + i) for i in range(4)] for k in range(20)]


@pytest.mark.timeout(120)
def test_cuda_tensors_travel_through_a_device_map_and_come_back_on_the_gpu() -> None:
    run = run_script("cuda_tensors.py", "mapped", timeout=100)
    run.assert_clean_exit(0)
    r = run.result("mapped")
    assert r["devices"][0] == r["devices"][1]
    assert r["arrived_cpu_actor"] == "cuda:0"  # a map says where it lands, whatever the actor's device
    assert r["arrived_gpu_actor"] == "cuda:0"
    assert r["nested"] == ["cuda:0", [0.0, 1.0, 2.0, 3.0], "cpu"]
    assert r["result"] == ["cuda:0", [0.0, 1.0, 2.0]]
    assert r["kept"] == TOLD  # tell's copy is ordered before the mutation on the stream


@pytest.mark.timeout(120)
def test_cuda_tensors_without_a_map_are_staged_to_the_receiving_actors_device() -> None:
    run = run_script("cuda_tensors.py", "staged", timeout=100)
    run.assert_clean_exit(0)
    r = run.result("staged")
    assert r["arrived_cpu_actor"] == "cpu"  # CUDA to the host: a CPU actor keeps it there
    assert r["arrived_gpu_actor"] == "cuda:0"  # the host to CUDA: the actor's device
    assert r["nested"] == ["cpu", [0.0, 1.0, 2.0, 3.0], "cpu"]
    assert r["result"] == ["cpu", [0.0, 1.0, 2.0]]  # main is no actor: results land on the host
    assert r["kept"] == TOLD
    assert r["big_bitwise"] == [True] * 4
    assert r["big_told"][0] == r["big_told"][1]


@pytest.mark.timeout(120)
def test_cuda_tensors_staged_on_one_host_go_through_a_segment_of_shared_memory() -> None:
    run = run_script("cuda_tensors.py", "staged-shm", timeout=100)
    run.assert_clean_exit(0)
    r = run.result("staged-shm")
    assert r["channels"]["staged"] >= 4
    assert r["channels"]["transport"] == 0
    assert r["arrived_cpu_actor"] == "cpu"
    assert r["arrived_gpu_actor"] == "cuda:0"
    assert r["result"] == ["cpu", [0.0, 1.0, 2.0]]
    assert r["kept"] == TOLD
    assert r["big_bitwise"] == [True] * 4, "a tensor of several chunks, and views of it, arrive bitwise"
    told, kept = r["big_told"]
    assert kept == told, "each told tensor arrives as it was told, though the sender changed it at once"


@pytest.mark.timeout(120)
def test_cuda_tensors_go_by_cuda_ipc_on_one_host_and_land_where_the_map_says() -> None:
    run = run_script("cuda_tensors.py", "ipc", timeout=100)
    run.assert_clean_exit(0)
    r = run.result("ipc")
    assert r["channels"]["cuda_ipc"] >= 4, "CUDA IPC carried them"
    assert r["channels"]["device_map"] == 0
    assert r["arrived_cpu_actor"] == "cuda:0"  # a map says where it lands, as on the map itself
    assert r["arrived_gpu_actor"] == "cuda:0"
    assert r["result"] == ["cuda:0", [0.0, 1.0, 2.0]]
    assert r["kept"] == TOLD  # the copy into the block is ordered before the mutation on the stream


@pytest.mark.timeout(120)
def test_cuda_tensors_by_cuda_ipc_without_a_map_land_where_staged_ones_would() -> None:
    run = run_script("cuda_tensors.py", "ipc-unmapped", timeout=100)
    run.assert_clean_exit(0)
    r = run.result("ipc-unmapped")
    assert r["channels"]["cuda_ipc"] >= 4
    assert r["arrived_cpu_actor"] == "cpu"
    assert r["arrived_gpu_actor"] == "cuda:0"
    assert r["result"] == ["cpu", [0.0, 1.0, 2.0]]
    assert r["kept"] == TOLD


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", ["empty-map", "empty-ipc", "empty-staged"])
def test_an_empty_cuda_tensor_never_aborts_a_process_on_any_path(case: str) -> None:
    run = run_script("cuda_limits.py", case, timeout=100)
    run.assert_clean_exit(0)
    r = run.result(case)
    assert [shape for _, shape, _ in r["arrived"]] == [shape for _, shape, _ in r["sent"]]
    assert [dtype for dtype, _, _ in r["arrived"]] == [dtype for dtype, _, _ in r["sent"]]
    assert {device for _, _, device in r["arrived"]} == {"cuda:0"}
    assert r["back"] == r["arrived"], "the node still serves"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", ["large-1g", "large-4g"])
def test_a_large_cuda_tensor_crosses_with_the_defaults(case: str) -> None:
    run = run_script("cuda_limits.py", case, timeout=280)
    run.assert_clean_exit(0)
    r = run.result(case)
    assert r["arrived"][0] == "cuda:0"
    assert r["arrived"][1] == [r["elements"]]
    assert r["arrived"][2] == r["expected"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["cuda-ipc", "cuda-map", "cuda-staged", "cuda-staged-shm"])
def test_drawn_cuda_tensors_cross_every_path_bitwise(mode: str) -> None:
    run = run_script("tensor_fidelity.py", mode, "40", timeout=280)
    run.assert_clean_exit(0)
    assert run.result("fidelity")["calls"] >= 40


@pytest.mark.timeout(300)
def test_bench_gpu_measures_both_paths_side_by_side() -> None:
    finished = run_argv(
        [
            sys.executable,
            str(REPO / "benchmarks" / "bench_gpu.py"),
            *("--sizes-mb", "1", "--rounds", "1", "--weights-mb", "16", "--actors", "2"),
        ],
        timeout=240.0,
    )
    assert finished.returncode == 0, finished.stderr
    assert "CUDA IPC, one host" in finished.stdout
    assert "device map cuda:0 -> cuda:0" in finished.stdout
    assert "staged through host memory" in finished.stdout
    assert "weight sync" in finished.stdout
