"""The torch RPC kind of transport: which of its transports a ``TransportSpec`` opens.

A static world runs on ``RpcTransport``; a world with a join token on
``ElasticRpcTransport`` (private to the node processes the system starts, or
public); a rank 0 alone on ``LoneTransport``, which opens a private elastic
world of its own, on a port it binds then, when it first starts a node process.
"""

from __future__ import annotations

import dataclasses
import functools

from actorch._transport.base import Transport, TransportSpec
from actorch._transport.membership import new_token
from actorch._transport.network import listen_socket
from actorch._transport.torch_rpc.elastic import ElasticRpcTransport
from actorch._transport.torch_rpc.lone import LoneTransport
from actorch._transport.torch_rpc.rpc import RpcTransport
from actorch._transport.torch_rpc.rpc_setup import RpcOptions

__all__ = ["open_torch_rpc"]


def open_torch_rpc(spec: TransportSpec) -> Transport:
    """The torch RPC transport that ``spec`` describes (not yet started).

    Raises:
        TypeError: ``spec.options`` are not ``RpcOptions``.
    """
    options = _options_of(spec)
    transport: Transport
    if spec.alone:
        transport = LoneTransport(functools.partial(_open_alone, spec, options))
    elif spec.token is None:
        transport = RpcTransport(spec.rank, spec.world_size, spec.host, spec.port, options, spec.listener)
    else:
        transport = _elastic(spec, options)
    if spec.traits is not None:
        transport.traits = spec.traits
    return transport


def _options_of(spec: TransportSpec) -> RpcOptions:
    if not isinstance(spec.options, RpcOptions):
        raise TypeError(f"a torch RPC transport takes RpcOptions, not {spec.options!r}")
    return spec.options


def _elastic(spec: TransportSpec, options: RpcOptions) -> ElasticRpcTransport:
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
    )


def _open_alone(spec: TransportSpec, options: RpcOptions) -> ElasticRpcTransport:
    """The elastic world a system of one node opens when it first starts a node process (only those may join)."""
    listener = listen_socket(spec.host, spec.port)
    port = listener.getsockname()[1]
    opened = dataclasses.replace(spec, port=port, listener=listener, token=new_token(), public=False, alone=False)
    return _elastic(opened, options)
