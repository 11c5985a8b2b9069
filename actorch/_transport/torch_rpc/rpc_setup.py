"""How the torch RPC transport is set up: its options, device maps, rendezvous store, and torch's C++ log level.

Nothing here touches ``torch.distributed.rpc`` itself; the transport (``rpc``) does.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import socket
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from actorch._base.config import is_count, is_number
from actorch._base.devices import parse_device
from actorch._transport.base import NodeInfo
from actorch._transport.membership import facts_of, info_of
from actorch._transport.network import listen_socket

__all__ = [
    "DeviceMapSpec",
    "DeviceMaps",
    "RpcOptions",
    "cpp_errors_quiet",
    "exchange_node_facts",
    "lane_secret",
    "normalize_device_maps",
    "quiet_cpp_logs",
    "rendezvous_store",
    "resolve_device_maps",
]

DeviceMaps = dict[int, dict[int, dict[str, str]]]
"""Device maps of a world: for each source rank, for each destination rank, local device to remote device."""

AUTO = "auto"

DeviceMapSpec = str | Mapping[Any, Any] | None
"""What ``run(device_maps=...)`` takes: ``"auto"``, None, one map, or maps per source and destination."""


def normalize_device_maps(spec: object) -> str | DeviceMaps | None:
    """Check ``run(device_maps=...)`` and put it in one form: ``"auto"``, None, or per source and destination.

    Accepted: ``"auto"``; None or ``{}`` (no maps); one map for every pair of
    nodes (``{"cuda:0": "cuda:0"}``); or maps per source and destination rank
    (``{0: {1: {"cuda:0": "cuda:1"}}}``). Devices are as torch's
    ``set_device_map`` takes them (``"cuda:1"``, ``1``, ``torch.device``).
    Returns ``{-1: {-1: map}}`` for one map for every pair.

    Raises:
        ValueError: The maps are malformed, name a device that is not a CUDA
            device, or are not one-to-one.
    """
    if spec is None:
        return None
    if spec == AUTO:
        return AUTO
    if not isinstance(spec, Mapping):
        raise ValueError(f"device_maps must be 'auto', None or a mapping, not {spec!r}")
    if not spec:
        return None
    if all(isinstance(value, Mapping) for value in spec.values()):
        maps: DeviceMaps = {}
        for src, per_dest in spec.items():
            if not is_count(src, 0):
                raise ValueError(f"device_maps: source ranks must be ints >= 0, not {src!r}")
            maps[src] = {}
            for dest, pairs in per_dest.items():
                if not is_count(dest, 0) or dest == src:
                    raise ValueError(f"device_maps[{src}]: destination ranks must be other ranks (ints), not {dest!r}")
                if not isinstance(pairs, Mapping):
                    raise ValueError(f"device_maps[{src}][{dest}] must map devices to devices, not {pairs!r}")
                maps[src][dest] = _one_map(pairs, f"device_maps[{src}][{dest}]")
        return maps
    return {-1: {-1: _one_map(spec, "device_maps")}}


def _one_map(pairs: Mapping[object, object], what: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for local, remote in pairs.items():
        devices = [parse_device(local, f"{what} key"), parse_device(remote, f"{what}[{local!r}]")]
        if any(device.type != "cuda" for device in devices):
            raise ValueError(f"{what}: device maps map CUDA devices to CUDA devices, not {local!r} to {remote!r}")
        found[str(devices[0])] = str(devices[1])
    if len(set(found.values())) != len(found):
        raise ValueError(f"{what} must be one-to-one (torch inverts it for responses), not {dict(pairs)!r}")
    return found


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


@dataclass(frozen=True)
class RpcOptions:
    """How TensorPipe is set up.

    actorch's own messages wait for no RPC timeout: a handler may compute for as
    long as it takes, and a node is lost only when the heartbeats say so.

    Attributes:
        transport: ``"uv"`` (TCP; idles at ~0 % CPU) or ``"shm"`` (shared memory;
            lower latency but busy-spins a core in every idle process).
        num_worker_threads: Size of torch's RPC thread pool.
            actorch's own messages need few, but raw torch RPC that blocks in
            them (``rref.to_here()`` inside a remote forward) needs one per
            nested call in flight.
        rpc_timeout: Seconds torch waits for raw torch RPC made by user code or
            torch's own tools (RRefs, ``DistributedOptimizer``, distributed
            autograd's backward) before failing it; 0 waits forever.
        init_timeout: Seconds to wait for every rank to join.
        heartbeat_interval: Seconds between pings to every peer.
        liveness_timeout: Seconds without hearing from a peer after which it is
            lost (a stopped process, a network partition); a peer on this
            machine whose process still runs is suspected, not lost, for up to
            ``STARVED_LIMIT`` times as long (see ``suspicion``).
        device_maps: Which CUDA devices travel directly to which node (see
            :func:`normalize_device_maps`); ``"auto"`` by default.
        strict_devices: Refuse accelerator tensors no device map covers,
            rather than stage them through host memory.
        lane: Send bundles that carry no tensors of their own on the fast
            lane (direct TCP connections between nodes) rather than torch RPC.
    """

    transport: str = "uv"
    num_worker_threads: int = 4
    rpc_timeout: float = 60.0
    init_timeout: float = 60.0
    heartbeat_interval: float = 0.5
    liveness_timeout: float = 2.5
    device_maps: Any = field(default=AUTO)
    strict_devices: bool = False
    lane: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "device_maps", normalize_device_maps(self.device_maps))
        if self.transport not in ("uv", "shm"):
            raise ValueError(f"transport must be 'uv' or 'shm', not {self.transport!r}")
        if not isinstance(self.lane, bool):
            raise ValueError(f"fast_lane must be True or False, not {self.lane!r}")
        if not is_count(self.num_worker_threads):
            raise ValueError(f"rpc_threads must be an int >= 1, not {self.num_worker_threads!r}")
        if not is_number(self.rpc_timeout):
            raise ValueError(f"rpc_timeout must be a finite number of seconds >= 0 (0: none), not {self.rpc_timeout!r}")
        if not 0 < self.heartbeat_interval <= self.liveness_timeout / 2:
            raise ValueError(
                f"heartbeat_interval must be > 0 and at most half of liveness_timeout ({self.liveness_timeout}), "
                f"not {self.heartbeat_interval!r}"
            )


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
    master: tuple[str, int], rank: int, world_size: int, options: RpcOptions, listener: socket.socket | None
) -> tuple[Any, Any]:
    """The store the ranks meet in, and its view under this world's prefix.

    Rank 0 serves it on ``listener`` (loopback by default), unless torchrun's
    agent already serves one. The caller keeps the store alive as long as the world.
    """
    host, port = master
    timeout = timedelta(seconds=options.init_timeout)
    if rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        if listener is None:
            listener = listen_socket(host, port)
        store = dist.TCPStore(  # type: ignore[attr-defined]
            host,
            port,
            world_size,
            True,
            timeout,
            wait_for_workers=False,
            master_listen_fd=listener.detach(),  # the store owns and closes it
        )
    else:
        store = dist.TCPStore(host, port, world_size, False, timeout)  # type: ignore[attr-defined]
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return store, dist.PrefixStore(f"actorch/{restart}", store)  # type: ignore[attr-defined]


def exchange_node_facts(store: Any, me: NodeInfo, world_size: int) -> list[NodeInfo]:
    """Every rank's node (host name, pid, devices, label, resources), shared through the store before torch RPC."""
    store.set(f"actorch/peer/{me.rank}", json.dumps(facts_of(me)))
    keys = [f"actorch/peer/{peer}" for peer in range(world_size)]
    store.wait(keys)
    return [info_of(json.loads(bytes(raw).decode())) for raw in store.multi_get(keys)]


_SECRET_KEY = "actorch/lane-secret"  # noqa: S105 - the store key the secret is kept under, not a secret


def lane_secret(store: Any, rank: int) -> bytes:
    """The world's fast-lane secret: rank 0 makes it and puts it in the store, the others read it there."""
    if rank == 0:
        secret = os.urandom(32)
        store.set(_SECRET_KEY, secret)
        return secret
    return bytes(store.get(_SECRET_KEY))
