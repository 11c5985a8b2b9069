"""A small end-to-end run for the other launch paths: world size 1, strict mode, torchrun.

Usage: ``python simple.py --world-size N|none [--strict]``, or under
``torchrun --nproc-per-node 2 simple.py --world-size none``.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

# isort: off
# actorch first, before anything imports torch: it quiets torch's C++ logging
# only if it runs first (basics.py imports in the usual order, torch first).
import actorch
import torch
from actors import Counter, attempt, attempt_now, emit

# isort: on


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--world-size", default="none")
    parser.add_argument("--strict", action="store_true")
    return parser.parse_args()


ARGS = parse()


async def main(system: actorch.ActorSystem) -> dict[str, Any]:
    last = system.world_size - 1
    c = await system.spawn(Counter, args=(1,), name="simple/c", on=last)
    typed = await c.call(Counter.add, 2)
    by_name = await c.call("add", 3)
    c.tell(Counter.add, 4)
    after_tell = await c.call(Counter.get)
    same = await system.lookup("simple/c")
    tensor = torch.arange(1000, dtype=torch.float64)
    tensor_back = await c.call(Counter.echo, tensor)
    emit(
        "simple",
        rank=system.rank,
        world_size=system.world_size,
        host=[c.rank, *await c.call(Counter.where)],
        node_pids=[node.pid for node in system.nodes],
        main_pid=os.getpid(),
        typed=typed,
        by_name=by_name,
        after_tell=after_tell,
        lookup_same=same == c,
        listed=[ref.name for ref in await system.lookup_all("simple/*")],
        tensor_equal=bool(torch.equal(tensor_back, tensor)),
    )
    set_call = await attempt(c.call(Counter.echo, {1, 2, 3}))
    if "value" in set_call:
        set_call["value"] = [type(set_call["value"]).__name__, sorted(set_call["value"])]
    set_result = await attempt(c.call(Counter.give_set))
    if "value" in set_result:
        set_result["value"] = [type(set_result["value"]).__name__, sorted(set_result["value"])]
    plain = {"a": [1, 2.5, "x\u00e9", None, True], "t": (1, 2), "b": b"\x00\xff"}
    plain_back = await c.call(Counter.echo, plain)
    emit(
        "serialization",
        strict=ARGS.strict,
        set_call=set_call,
        set_tell=attempt_now(lambda: c.tell(Counter.echo, {4, 5})),
        set_result=set_result,
        plain_equal=plain_back == plain,
        ref_equal=(await c.call(Counter.echo, c)) == c,
        still_serving=await c.call(Counter.get),
    )
    return {"answer": 42, "rank": system.rank}


if __name__ == "__main__":
    size = None if ARGS.world_size == "none" else int(ARGS.world_size)
    result = actorch.run(main, world_size=size, strict=ARGS.strict)
    print("RETURNED " + json.dumps(result), flush=True)
