"""After ``run`` returns, what is left of the processes it started: printed from the process table.

Usage: ``python tidy_exit.py``; a three-process world, then this process's children as ``/proc`` lists them.
"""

from __future__ import annotations

import json
import os

import actorch


async def main(system: actorch.ActorSystem) -> int:
    return system.world_size


def children() -> list[dict[str, str]]:
    """This process's children: pid, state (``Z`` is a zombie) and command line."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                command = cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue  # gone meanwhile
        if int(fields[1]) == os.getpid():
            found.append({"pid": entry, "state": fields[0], "command": command})
    return found


if __name__ == "__main__":
    returned = actorch.run(main, world_size=3)
    print("RETURNED " + json.dumps({"returned": returned, "children": children()}), flush=True)
