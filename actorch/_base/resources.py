"""What a node has to offer actors: CPUs, GPUs and memory it detects, plus counts its launcher declares.

A node's *resources* are a mapping of names to amounts. Three names are
detected on every node: ``cpus`` (the CPUs this process may run on), ``memory``
(bytes of physical memory of its machine) and ``gpus`` (its accelerator
devices). Anything else is declared: ``run(resources={"env_slots": 4})``,
``serve(resources=...)``, ``add_nodes(..., resources=...)``. A declared amount
of a detected name replaces the detected one, which is how several nodes on one
machine split its CPUs between them.
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Mapping, Sequence

__all__ = [
    "CPUS",
    "GPUS",
    "MEMORY",
    "check_resources",
    "describe_amount",
    "detect_resources",
    "node_resources",
]

CPUS = "cpus"
GPUS = "gpus"
MEMORY = "memory"

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,63}")


def detect_resources(devices: Sequence[str]) -> dict[str, float]:
    """What this process has: the CPUs it may run on, its machine's memory in bytes, and ``devices``."""
    cpus, memory = _machine()
    return {CPUS: cpus, MEMORY: memory, GPUS: float(len(devices))}


@functools.cache
def _machine() -> tuple[float, float]:
    """This process's CPUs and its machine's memory, read once (they do not change while it runs)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):  # a platform without these names
        memory = 0
    return float(cpus), float(memory)


def check_resources(value: object, what: str = "resources") -> dict[str, float]:
    """``value`` as a plain mapping of resource names to amounts, checked.

    Names are identifiers (letters, digits, ``_``, ``.``, ``-``; a letter or
    ``_`` first); amounts are finite numbers >= 0, and ``gpus`` a whole number.

    Raises:
        TypeError: ``value`` is not a mapping.
        ValueError: A name or an amount breaks the rule; the message says which.
    """
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"{what} must be a mapping of names to amounts ({{'env_slots': 4}}), not {value!r}")
    checked: dict[str, float] = {}
    for name, amount in value.items():
        if not isinstance(name, str) or _NAME.fullmatch(name) is None:
            raise ValueError(
                f"{what}: {name!r} is not a resource name (letters, digits, '_', '.', '-', a letter or '_' first)"
            )
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or not math.isfinite(amount) or amount < 0:
            raise ValueError(f"{what}[{name!r}] must be a finite number >= 0, not {amount!r}")
        if name == GPUS and amount != int(amount):
            raise ValueError(f"{what}[{name!r}] must be a whole number, not {amount!r}")
        checked[name] = float(amount)
    return checked


def node_resources(devices: Sequence[str], declared: Mapping[str, float] | None) -> dict[str, float]:
    """A node's resources: what it detects (:func:`detect_resources`), with the ``declared`` amounts over them."""
    return {**detect_resources(devices), **(declared or {})}


def describe_amount(name: str, amount: float) -> str:
    """An amount as people read it: ``2 cpus``, ``1.5 GiB memory``, ``4 env_slots``."""
    if name == MEMORY:
        return f"{amount / 2**30:.3g} GiB memory"
    shown = f"{int(amount)}" if amount == int(amount) else f"{amount:g}"
    return f"{shown} {name}"
