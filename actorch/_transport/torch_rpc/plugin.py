"""The torch RPC kind of transport: its ``Kind`` record, and which of its transports a ``WorldSpec`` opens.

A static world runs on ``RpcTransport``; a world with a join token on
``ElasticRpcTransport`` (private to the node processes the system starts, or
public); a rank 0 alone on ``LoneTransport``, which opens a private elastic
world of its own, on a port it binds then, when it first starts a node process.
With ``TorchRpc(lane=True)`` each torch RPC transport has the fast lane beside
it (``LaneTransport``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

from actorch._transport.base import Transport
from actorch._transport.kind import Joining, Kind, Load
from actorch._transport.lane.transport import LaneTransport
from actorch._transport.membership import new_token
from actorch._transport.network import listen_socket
from actorch._transport.torch_rpc.elastic import ElasticRpcTransport, prepare_join
from actorch._transport.torch_rpc.lone import LoneTransport
from actorch._transport.torch_rpc.options import TorchRpc
from actorch._transport.torch_rpc.rpc import RpcTransport, active_transport, drop_at_exit
from actorch._transport.world import WorldSpec

__all__ = ["KIND", "open_torch_rpc"]


def open_torch_rpc(spec: WorldSpec, options: TorchRpc, inner: Transport | None = None) -> Transport:
    """The torch RPC transport that ``spec`` describes (not yet started), the fast lane beside it if asked.

    Raises:
        TypeError: ``options`` are not ``TorchRpc``.
    """
    if not isinstance(options, TorchRpc):
        raise TypeError(f"a torch RPC transport takes TorchRpc options, not {options!r}")
    transport: Transport
    if spec.alone:
        transport = LoneTransport(functools.partial(_open_alone, spec, options))
    elif spec.token is None:
        static = RpcTransport(
            spec.rank,
            spec.world_size,
            spec.host,
            spec.port,
            options,
            spec.listener,
            liveness_timeout=spec.liveness_timeout,
        )
        transport = _with_lane(static, options, spec)
    else:
        transport = _with_lane(_elastic(spec, options), options, spec)
    if spec.traits is not None:
        transport.traits = spec.traits
    return transport


def _with_lane(transport: RpcTransport, options: TorchRpc, spec: WorldSpec) -> Transport:
    """``transport`` with the fast lane beside it, if ``options`` ask for one."""
    if not options.lane:
        return transport
    return LaneTransport(transport, liveness_timeout=spec.liveness_timeout)


def _elastic(spec: WorldSpec, options: TorchRpc) -> ElasticRpcTransport:
    """The elastic transport of ``spec`` (it has a token); a private world has no device maps."""
    return ElasticRpcTransport(
        spec.rank,
        spec.host,
        spec.port,
        options if spec.public else dataclasses.replace(options, device_maps=None),
        token=spec.token,
        initial=spec.initial,
        label=spec.label,
        listener=spec.listener,
        shared=dict(spec.shared) if spec.shared is not None else None,
        public=spec.public,
        invited=spec.invited,
        liveness_timeout=spec.liveness_timeout,
    )


def _open_alone(spec: WorldSpec, options: TorchRpc) -> Transport:
    """The elastic world a system of one node opens when it first starts a node process (only those may join)."""
    listener = listen_socket(spec.host, spec.port)
    port = listener.getsockname()[1]
    opened = dataclasses.replace(spec, port=port, listener=listener, token=new_token(), public=False, alone=False)
    return _with_lane(_elastic(opened, options), options, opened)


def _load(data: Mapping[str, Any], load: Load) -> TorchRpc:
    return TorchRpc.from_json(data)


def _prepare_join(host: str, port: int, timeout: float, invited: bool) -> Joining:
    return prepare_join(host, port, timeout, invited=invited)


def _running() -> bool:
    return active_transport() is not None


KIND: Kind[TorchRpc] = Kind(
    name="torch_rpc",
    options=TorchRpc,
    open=open_torch_rpc,
    load=_load,
    prepare_join=_prepare_join,
    at_exit=drop_at_exit,
    running=_running,
)
"""torch RPC (TensorPipe), with the fast lane beside it unless ``TorchRpc(lane=False)``."""
