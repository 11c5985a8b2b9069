"""``TorchRpc``: torch RPC's own options, the record a user passes to pick it (``run(transport=TorchRpc(...))``).

torch RPC (TensorPipe) is the kind every launch opens unless told otherwise.
Its record holds what only it has: TensorPipe's channel, the fast lane beside
it, torch's thread pool and timeout for raw torch RPC, and the device maps
that carry CUDA tensors directly. What any kind shares (where the ranks meet,
who may join, the liveness timeout) is the launch's, in the ``WorldSpec``; the
data plane's options (``channels``, ``shm_pool``, ``devices``) are the system's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Self

from actorch._base.config import is_count, is_number
from actorch._base.devices import accelerator, parse_device
from actorch._transport.kind import Dump

__all__ = ["AUTO", "DeviceMapSpec", "DeviceMaps", "TorchRpc", "normalize_device_maps"]

DeviceMaps = dict[int, dict[int, dict[str, str]]]
"""Device maps of a world: for each source rank, for each destination rank, local device to remote device."""

AUTO = "auto"

DeviceMapSpec = str | Mapping[Any, Any] | None
"""What ``TorchRpc(device_maps=...)`` takes: ``"auto"``, None, one map, or maps per source and destination."""

TENSORPIPE_CHANNELS = ("uv", "shm")
"""TensorPipe's transports a node may use: TCP, or shared memory on one host."""

DEVICE_MAPS_FIX_THE_WORLD = (
    "this system's nodes carry GPU tensors with device maps, which TensorPipe fixes when it starts: "
    "run it with transport=TorchRpc(device_maps=None) to let it start node processes"
)


def normalize_device_maps(spec: object) -> str | DeviceMaps | None:
    """Check ``TorchRpc(device_maps=...)`` and put it in one form: ``"auto"``, None, or per source and destination.

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


@dataclass(frozen=True)
class TorchRpc:
    """torch RPC (TensorPipe) as the system's transport, with its own options; the default kind.

    ``actorch.run(main, world_size=3, transport=actorch.TorchRpc(tensorpipe="shm"))``.
    Every value is checked when the record is made (``ValueError`` naming it).
    actorch's own messages wait for no RPC timeout: a handler may compute for
    as long as it takes, and a node is lost only when the heartbeats say so
    (``run(liveness_timeout=...)``).

    Attributes:
        tensorpipe: TensorPipe's transport: ``"uv"`` (TCP; idles at ~0 % CPU) or
            ``"shm"`` (shared memory; lower latency, but busy-spins a core in
            every idle process).
        lane: Send the bundles of messages that carry no tensors of their own
            (small tensors ride inside messages) on the fast lane, direct TCP
            connections between nodes, rather than torch RPC: about a tenth of
            the CPU and the latency. False sends everything through torch RPC.
        threads: Threads in torch's RPC pool on every node. actorch's own
            messages need few; raw torch RPC that blocks inside a remote
            function (``rref.to_here()`` inside a remote forward) needs one per
            such call in flight.
        timeout: Seconds torch waits for raw torch RPC made by your code or
            torch's own tools (``rref.to_here()``, ``DistributedOptimizer``,
            distributed autograd's backward) before failing it; 0 waits forever.
        device_maps: Which CUDA devices travel directly between nodes, on
            TensorPipe's CUDA channels (torch's ``set_device_map`` semantics).
            ``"auto"``: on a local launch where every process sees a GPU,
            ``cuda:i`` maps to ``cuda:i`` between every pair of nodes;
            otherwise nothing. None: no maps. One map for every pair
            (``{"cuda:0": "cuda:1"}``), or maps per source and destination rank
            (``{0: {1: {"cuda:0": "cuda:1"}}}``). See docs/guides/gpus.md.
        init_timeout: Seconds a node waits for the others to meet it at start
            (and a newcomer to be let into a running world).
    """

    tensorpipe: str = "uv"
    lane: bool = True
    threads: int = 4
    timeout: float = 60.0
    device_maps: Any = field(default=AUTO)
    init_timeout: float = 60.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "device_maps", normalize_device_maps(self.device_maps))
        if self.tensorpipe not in TENSORPIPE_CHANNELS:
            raise ValueError(f"tensorpipe must be 'uv' or 'shm', not {self.tensorpipe!r}")
        if not isinstance(self.lane, bool):
            raise ValueError(f"lane must be True or False, not {self.lane!r}")
        if not is_count(self.threads):
            raise ValueError(f"threads must be an int >= 1, not {self.threads!r}")
        if not is_number(self.timeout):
            raise ValueError(f"timeout must be a finite number of seconds >= 0 (0: none), not {self.timeout!r}")
        if not is_number(self.init_timeout, inclusive=False):
            raise ValueError(f"init_timeout must be a positive number of seconds, not {self.init_timeout!r}")

    def refuses_elastic(self) -> str | None:
        """Maps of its own refuse an elastic world (``"auto"`` gives way: GPU tensors are staged there)."""
        if self.device_maps is not None and self.device_maps != AUTO:
            return "an elastic system has no device maps (GPU tensors are staged): leave device_maps alone"
        return None

    def fixes_world(self) -> str | None:
        """Device maps need a static world: its own, or ``"auto"`` where this process sees a GPU."""
        maps = self.device_maps
        if maps is None or (maps == AUTO and not accelerator().inventory()):
            return None
        return DEVICE_MAPS_FIX_THE_WORLD

    def joining(self, timeout: float | None = None) -> Self:
        """A newcomer's options: no device maps (a growing world has none), let in within ``timeout`` s."""
        init_timeout = self.init_timeout if timeout is None else timeout
        return dataclasses.replace(self, device_maps=None, init_timeout=init_timeout)

    def to_json(self, dump: Dump) -> dict[str, Any]:
        """Every field but the device maps, which no node that joins a running world has."""
        return {
            "tensorpipe": self.tensorpipe,
            "lane": self.lane,
            "threads": self.threads,
            "timeout": self.timeout,
            "init_timeout": self.init_timeout,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TorchRpc:
        """The options ``to_json`` made (without device maps).

        Raises:
            TypeError: A field it does not have.
            ValueError: A value it does not take.
        """
        return cls(device_maps=None, **data)
