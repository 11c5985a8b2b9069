"""One restart of a torchrun group: ``actorch run -n 2 --max-restarts 1 restart.py TMPDIR``.

In the first attempt rank 0 fills a replay buffer on rank 1, has it write its
snapshot to ``TMPDIR/replay.snap``, and kills rank 1's process: torchrun sees a
rank fail and starts the whole group again. In the second attempt
(``TORCHELASTIC_RESTART_COUNT`` 1) the buffer is spawned from that file, and
what it held comes back. Each attempt reports what its buffer held at spawn.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import torch
from actors import emit

import actorch

SNAPSHOT = Path(sys.argv[1]) / "replay.snap"


async def main(system: actorch.ActorSystem) -> int:
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    kwargs = {"restore": str(SNAPSHOT)} if SNAPSHOT.exists() else {}
    buffer = await system.spawn(actorch.ReplayBuffer, args=(100,), kwargs=kwargs, name="replay", on=1)
    held = (await buffer.call(actorch.ReplayBuffer.statistics))["size"]
    emit(f"attempt{attempt}", size=held, restored=bool(kwargs))
    if attempt == 0:
        await buffer.call(actorch.ReplayBuffer.extend, {"x": torch.arange(10.0)})
        await buffer.call(actorch.ReplayBuffer.snapshot, str(SNAPSHOT))
        os.kill(system.nodes[1].pid, signal.SIGKILL)  # a worker dies: torchrun restarts the group
        await asyncio.sleep(60)  # ended by torchrun long before this
    return held


if __name__ == "__main__":
    print("RETURNED", actorch.run(main, stop_grace=1.0), flush=True)
