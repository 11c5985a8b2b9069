"""How the torch RPC transport is set up: its options, its rendezvous store, and torch's C++ log level.

Nothing here touches ``torch.distributed.rpc`` itself; the transport (``rpc``) does.
"""

from __future__ import annotations

import ctypes
import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from actorch._base.config import is_count, is_number
from actorch._transport.network import listen_socket

__all__ = ["RpcOptions", "quiet_cpp_logs", "rendezvous_store"]


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
            lost (a stopped process, a network partition).
    """

    transport: str = "uv"
    num_worker_threads: int = 4
    rpc_timeout: float = 60.0
    init_timeout: float = 60.0
    heartbeat_interval: float = 0.5
    liveness_timeout: float = 2.5

    def __post_init__(self) -> None:
        if self.transport not in ("uv", "shm"):
            raise ValueError(f"transport must be 'uv' or 'shm', not {self.transport!r}")
        if not is_count(self.num_worker_threads):
            raise ValueError(f"rpc_threads must be an int >= 1, not {self.num_worker_threads!r}")
        if not is_number(self.rpc_timeout):
            raise ValueError(f"rpc_timeout must be a finite number of seconds >= 0 (0: none), not {self.rpc_timeout!r}")
        if not 0 < self.heartbeat_interval <= self.liveness_timeout / 2:
            raise ValueError(
                f"heartbeat_interval must be > 0 and at most half of liveness_timeout ({self.liveness_timeout}), "
                f"not {self.heartbeat_interval!r}"
            )


def quiet_cpp_logs() -> None:
    """Silence TensorPipe's C++ warnings where ``TORCH_CPP_LOG_LEVEL`` asks for errors only."""
    # TORCH_CPP_LOG_LEVEL is read only when torch loads; a script that imported
    # torch before actorch would still see TensorPipe's "[W ...]" lines about
    # closed pipes. The variable only sets this flag, so set the flag the same way.
    if os.environ.get("TORCH_CPP_LOG_LEVEL", "").upper() not in ("ERROR", "2"):
        return  # the user chose a level: leave it
    try:
        library = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
        level = ctypes.c_int.in_dll(library, "FLAGS_caffe2_log_level")
    except (OSError, ValueError):
        return  # another build of torch: nothing to adjust
    level.value = max(level.value, 2)


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
