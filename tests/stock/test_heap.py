"""Keeping freed memory in the process: steps that free and take the same megabytes stop faulting them in."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from _mp import SCRIPTS
from torch import nn

from actorch._stock.heap import keep_freed_memory
from actorch.rl import Collection, Collector
from actorch.testing import LocalWorld

sys.path.insert(0, str(SCRIPTS))
from corridor import corridor


def policy() -> nn.Module:
    """Two observation features to two action probabilities."""
    return nn.Sequential(nn.Linear(2, 2), nn.Softmax(dim=-1))


GLIBC = (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc") if hasattr(os, "confstr") else False
glibc_only = pytest.mark.skipif(not GLIBC, reason="malloc's thresholds are glibc's")

# A process whose thresholds sit low (as glibc's moving ones may), then steps that free and take 4 MB each.
STEPS = textwrap.dedent(
    """
    import ctypes, resource, torch
    from actorch._stock.heap import keep_freed_memory
    mallopt = ctypes.CDLL(None).mallopt
    mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD
    mallopt(-1, 128 * 1024)  # M_TRIM_THRESHOLD

    def faults_per_step():
        for _ in range(5):  # the first steps may take the memory from the kernel
            torch.ones(2**20)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(20):
            torch.ones(2**20)
        return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20

    print(faults_per_step(), keep_freed_memory(), faults_per_step())
    """
)


def run(script: str, **environment: str) -> str:
    env = {name: value for name, value in os.environ.items() if not name.startswith("MALLOC_")}
    env.pop("GLIBC_TUNABLES", None)
    env.update(environment)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False, env=env
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]  # after any log line (structlog prints when unconfigured)


@glibc_only
def test_keep_freed_memory_stops_steps_from_faulting_their_memory_in_again() -> None:
    before, took, after = run(STEPS).split()
    assert took == "True"
    assert float(before) > 500, "a 4 MB tensor mapped afresh faults in its thousand pages"
    assert float(after) < 10


@glibc_only
@pytest.mark.parametrize(
    "environment", [{"MALLOC_TRIM_THRESHOLD_": "1000000"}, {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1000000"}]
)
def test_keep_freed_memory_leaves_thresholds_the_user_set(environment: dict[str, str]) -> None:
    script = "from actorch._stock.heap import keep_freed_memory; print(keep_freed_memory())"
    assert run(script, **environment) == "False"


async def test_collector_keeps_the_freed_memory_of_its_process(world: LocalWorld) -> None:
    keep_freed_memory.cache_clear()
    await world[0].spawn(Collector, args=(corridor, policy), kwargs={"num_envs": 2, "frames_per_batch": 4}, on=1)
    assert keep_freed_memory.cache_info().currsize == 1, "the collector set its process's malloc up"


async def test_collection_keeps_the_freed_memory_of_the_learners_process(world: LocalWorld) -> None:
    collector = await world[0].spawn(Collector, args=(corridor, policy), kwargs={"num_envs": 2, "frames_per_batch": 4})
    keep_freed_memory.cache_clear()
    async with Collection([collector]):
        assert keep_freed_memory.cache_info().currsize == 1, "the learner's process set its malloc up"
