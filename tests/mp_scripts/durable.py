"""A job that comes back after rank 0's loss: ``actorch run -n 3 --max-restarts 1 --snapshots DIR durable.py TMPDIR``.

In the first attempt (``TORCHELASTIC_RESTART_COUNT`` 0) ``main`` spawns three
named relocatable actors: a ``Tally`` that saves every 5 additions (node 1), a
``ReplayBuffer`` that saves every 10 transitions (node 2) and a
``ParameterServer`` that saves every 4 pushes (node 1). It adds 57 to the
tally, 57 transitions one at a time and pushes 11 gradients, reports what each
holds, notes the time in ``TMPDIR/killed`` and SIGKILLs its own process: rank
0 is gone, every worker ends, and torchrun's agent starts the group again.
In the second attempt ``main`` spawns the same three under the same names and
reports what each holds at once (their last snapshots in DIR), then goes on
adding, and returns the tally's count.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
from actors import Tally, emit

import actorch

TMP = Path(sys.argv[1])
RELOCATE = actorch.Restart(relocate=True)
ADDED = 57
PUSHES = 11


async def spawn_all(system: actorch.ActorSystem) -> tuple[Any, Any, Any]:
    tally = await system.spawn(Tally, args=(5,), name="tally", on=1, restart=RELOCATE)
    replay = await system.spawn(
        actorch.ReplayBuffer, args=(100,), kwargs={"snapshot_every": 10}, name="replay", on=2, restart=RELOCATE
    )
    params = await system.spawn(
        actorch.ParameterServer,
        args=("models:tiny_model",),
        kwargs={"optimizer": "torch.optim.Adam", "snapshot_every": 4},
        name="params",
        on=1,
        restart=RELOCATE,
    )
    return tally, replay, params


async def held(tally: Any, replay: Any, params: Any) -> dict[str, int]:
    return {
        "tally": await tally.call(Tally.get),
        "replay": (await replay.call(actorch.ReplayBuffer.statistics))["size"],
        "params": await params.call(actorch.ParameterServer.version),
    }


async def main(system: actorch.ActorSystem) -> int:
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    started = time.time()
    tally, replay, params = await spawn_all(system)
    emit(f"spawned{attempt}", **await held(tally, replay, params), spawn_seconds=time.time() - started)
    if attempt == 0:
        for index in range(ADDED):
            await tally.call(Tally.add)
            await replay.call(actorch.ReplayBuffer.add, {"x": torch.tensor(float(index))})
        grads = {
            name: torch.ones(p.shape) for name, p in (await params.call(actorch.ParameterServer.pull)).tensors.items()
        }
        for _ in range(PUSHES):
            await params.call(actorch.ParameterServer.push, grads)
        emit("before", **await held(tally, replay, params))
        (TMP / "killed").write_text(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)  # rank 0 dies mid-run: the agent starts the group again
    killed = float((TMP / "killed").read_text())
    emit("restarted", seconds=started - killed)
    sample = await replay.call(actorch.ReplayBuffer.sample, 4000)  # every one of 50 drawn, near certainly
    emit("kept", transitions=sorted(set(sample.data["x"].tolist())))
    return await tally.call(Tally.add, 3)


if __name__ == "__main__":
    print("RETURNED", actorch.run(main, stop_grace=1.0), flush=True)
