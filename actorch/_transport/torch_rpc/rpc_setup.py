"""How the torch RPC transport is set up: device maps, the rendezvous store, the world's secret, torch's C++ logs.

Nothing here touches ``torch.distributed.rpc`` itself; the transport (``rpc``) does.
The options it is set up from are ``TorchRpc``'s (``options``).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import socket
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from actorch._transport.base import NodeInfo
from actorch._transport.membership import facts_of, info_of
from actorch._transport.network import listen_socket
from actorch._transport.torch_rpc.options import AUTO, DeviceMaps

__all__ = [
    "cpp_errors_quiet",
    "exchange_node_facts",
    "quiet_cpp_logs",
    "rendezvous_store",
    "resolve_device_maps",
    "world_secret",
]


def resolve_device_maps(
    spec: str | DeviceMaps | None, rank: int, inventories: Sequence[Sequence[str]], hosts: Sequence[str]
) -> dict[int, dict[str, str]]:
    """The device maps from ``rank`` to each other rank, given every rank's devices and host.

    ``"auto"`` maps ``cuda:i`` to ``cuda:i`` between every pair (for the
    devices every rank has) when all ranks run on one host and each sees at
    least one GPU; otherwise it maps nothing, and accelerator tensors are staged.

    Raises:
        ValueError: A map names a device its rank does not have.
    """
    world_size = len(inventories)
    if spec is None:
        return {}
    if spec == AUTO:
        shared = min(len(devices) for devices in inventories)
        if shared == 0 or len(set(hosts)) != 1:
            return {}
        identity = {f"cuda:{index}": f"cuda:{index}" for index in range(shared)}
        return {dest: dict(identity) for dest in range(world_size) if dest != rank}
    assert isinstance(spec, dict)
    everywhere = spec.get(-1, {}).get(-1)
    found: dict[int, dict[str, str]] = {}
    for dest in range(world_size):
        pairs = everywhere if everywhere is not None else spec.get(rank, {}).get(dest)
        if dest == rank or not pairs:
            continue
        for local, remote in pairs.items():
            for who, device in ((rank, local), (dest, remote)):
                if device not in inventories[who]:
                    have = ", ".join(inventories[who]) or "no GPU"
                    raise ValueError(
                        f"device_maps maps node {rank}'s {local} to node {dest}'s {remote}, but node {who} has "
                        f"no {device} (it has {have})"
                    )
        found[dest] = dict(pairs)
    for src in spec:
        for dest in spec[src]:
            if src != -1 and (src >= world_size or dest >= world_size):
                raise ValueError(f"device_maps names ranks {src} -> {dest}, outside a world of {world_size}")
    return found


def _cpp_log_level() -> Any:
    """The C++ log level flag of torch (``TORCH_CPP_LOG_LEVEL`` only sets it when torch loads); None if not found."""
    try:
        library = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
        return ctypes.c_int.in_dll(library, "FLAGS_caffe2_log_level")
    except (OSError, ValueError):
        return None  # another build of torch: nothing to adjust


def quiet_cpp_logs() -> None:
    """Silence TensorPipe's C++ warnings where ``TORCH_CPP_LOG_LEVEL`` asks for errors only."""
    # TORCH_CPP_LOG_LEVEL is read only when torch loads; a script that imported
    # torch before actorch would still see TensorPipe's "[W ...]" lines about
    # closed pipes. The variable only sets this flag, so set the flag the same way.
    if os.environ.get("TORCH_CPP_LOG_LEVEL", "").upper() not in ("ERROR", "2"):
        return  # the user chose a level: leave it
    level = _cpp_log_level()
    if level is not None:
        level.value = max(level.value, 2)


@contextlib.contextmanager
def cpp_errors_quiet() -> Iterator[None]:
    """Keep torch's C++ code from printing errors (with a stack dump) that reach Python as exceptions anyway."""
    level = _cpp_log_level()
    if level is None or os.environ.get("TORCH_CPP_LOG_LEVEL", "").upper() not in ("ERROR", "2"):
        yield
        return
    before = level.value
    level.value = max(before, 3)
    try:
        yield
    finally:
        level.value = before


def rendezvous_store(
    master: tuple[str, int], rank: int, world_size: int, timeout: float, listener: socket.socket | None
) -> tuple[Any, Any]:
    """The store the ranks meet in, and its view under this world's prefix.

    Rank 0 serves it on ``listener`` (loopback by default), unless torchrun's
    agent already serves one; every wait on it is bounded by ``timeout`` seconds.
    The caller keeps the store alive as long as the world.
    """
    host, port = master
    waits = timedelta(seconds=timeout)
    if rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        if listener is None:
            listener = listen_socket(host, port)
        store = dist.TCPStore(  # type: ignore[attr-defined]
            host,
            port,
            world_size,
            True,
            waits,
            wait_for_workers=False,
            master_listen_fd=listener.detach(),  # the store owns and closes it
        )
    else:
        store = dist.TCPStore(host, port, world_size, False, waits)  # type: ignore[attr-defined]
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return store, dist.PrefixStore(f"actorch/{restart}", store)  # type: ignore[attr-defined]


def exchange_node_facts(store: Any, me: NodeInfo, world_size: int) -> list[NodeInfo]:
    """Every rank's node (host name, pid, devices, label, resources), shared through the store before torch RPC."""
    store.set(f"actorch/peer/{me.rank}", json.dumps(facts_of(me)))
    keys = [f"actorch/peer/{peer}" for peer in range(world_size)]
    store.wait(keys)
    return [info_of(json.loads(bytes(raw).decode())) for raw in store.multi_get(keys)]


_SECRET_KEY = "actorch/lane-secret"  # noqa: S105 - the store key the secret is kept under, not a secret


def world_secret(store: Any, rank: int) -> bytes:
    """The world's secret, which a path beside torch RPC proves: rank 0 makes it and puts it in the store."""
    if rank == 0:
        secret = os.urandom(32)
        store.set(_SECRET_KEY, secret)
        return secret
    return bytes(store.get(_SECRET_KEY))
