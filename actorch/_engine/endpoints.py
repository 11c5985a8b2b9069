"""What an endpoint is, and the checks a call to one must pass, with their messages, written once.

A cell checks a call when its handler starts; a ref checks a tell before it is
sent when the actor's class can be imported there, so that a bad tell fails at
the sender rather than in a log on another node.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from actorch._base.errors import EndpointError
from actorch._engine.batching import Batched

__all__ = ["Endpoint", "check_call", "endpoint_name", "is_streaming", "unknown_endpoint", "wrong_verb"]

Endpoint = Callable[..., Awaitable[Any]] | Batched[Any, Any, Any]
"""An endpoint as its class holds it: an ``async def`` function, or a batched one."""


def endpoint_name(method: Any) -> str:
    """The name of an endpoint given as a method (``Counter.add``) or as its name."""
    if type(method) is str:
        return method
    name = getattr(method, "__name__", None)
    if not isinstance(name, str):
        raise EndpointError(f"an endpoint is an actor method or its name, not {method!r}")
    return name


def unknown_endpoint(endpoint: str, label: str, known: Iterable[str], cls: type | None = None) -> str:
    """The message for a call to an endpoint the actor does not have, or that is private.

    A public plain ``def`` method of ``cls`` (the actor's class) is no endpoint:
    the message for calling one says to make it ``async def``.
    """
    if endpoint.startswith("_"):
        return f"{endpoint!r} of {label} is private: endpoints are public async methods"
    if cls is not None and _is_plain_method(cls, endpoint):
        return (
            f"{endpoint!r} of {label} is a plain `def` method of {cls.__qualname__}, and only `async def` methods "
            f"are endpoints: make it `async def {endpoint}(...)`, and run blocking work in it with "
            "`await asyncio.to_thread(...)` so that the node's other actors keep running"
        )
    return f"{label} has no endpoint {endpoint!r} (endpoints: {', '.join(sorted(known)) or 'none'})"


def _is_plain_method(cls: type, name: str) -> bool:
    """Whether ``cls.name`` is a plain (not ``async``) method: a helper or a hook, which callers cannot call."""
    value = inspect.getattr_static(cls, name, None)
    return inspect.isfunction(value) and not (inspect.iscoroutinefunction(value) or inspect.isasyncgenfunction(value))


def is_streaming(handler: object) -> bool:
    """Whether an endpoint is a streaming one: an ``async def`` that ``yield``s (an async generator function)."""
    return inspect.isasyncgenfunction(handler)


def wrong_verb(endpoint: str, label: str, *, streaming: bool) -> str:
    """The message for a streaming endpoint called or told, or a plain one streamed."""
    if streaming:
        return (
            f"{endpoint!r} of {label} is a streaming endpoint (an async generator): "
            "consume it with `async for item in ref.stream(...)`, not call or tell"
        )
    return (
        f"{endpoint!r} of {label} is not a streaming endpoint: call it with ref.call() "
        "(ref.stream() takes an endpoint that yields)"
    )


def check_call(
    endpoints: Mapping[str, Endpoint],
    endpoint: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    label: str,
    cls: type | None = None,
) -> None:
    """Raise ``EndpointError`` unless ``endpoint`` is one of ``endpoints`` (``cls``'s) and takes these arguments."""
    handler = endpoints.get(endpoint)
    if not kwargs and handler is not None:
        shape = _shapes.get(handler)
        if shape is not None and shape[0] <= len(args) <= shape[1]:
            return  # the common case: a plain endpoint whose positional arguments fit, in one lookup
    if isinstance(handler, Batched):
        error = handler.check(args, kwargs, label)
        if error is not None:
            raise error
        return
    if handler is None:
        raise EndpointError(unknown_endpoint(endpoint, label, endpoints, cls))
    if is_streaming(handler):
        raise EndpointError(wrong_verb(endpoint, label, streaming=True))
    if not kwargs:
        if len(_shapes) >= _SHAPES_KEPT:
            _shapes.clear()  # classes made on the fly (tests, notebooks) must not pile up
        least, most = _shapes[handler] = _positional_range(handler)
        if least <= len(args) <= most:
            return
    try:
        _signature(handler).bind(None, *args, **kwargs)
    except TypeError as exc:
        raise EndpointError(f"bad arguments for {endpoint!r} of {label}: {exc}") from None


_SHAPES_KEPT = 4096
_shapes: dict[Endpoint, tuple[float, float]] = {}
"""The positional range of each plain (not streaming, not batched) endpoint checked so far: the fast path's cache."""


@functools.lru_cache(maxsize=1024)
def _signature(handler: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(handler)


def _positional_range(handler: Callable[..., Any]) -> tuple[float, float]:
    """How many positional arguments ``handler`` takes after ``self`` when given no keyword: (least, most).

    ``(1, 0)``, which nothing fits, when a keyword-only parameter is required.
    """
    least, most = 0, 0.0
    for parameter in list(_signature(handler).parameters.values())[1:]:
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            most += 1
            if parameter.default is parameter.empty:
                least = int(most)
        elif parameter.kind is parameter.VAR_POSITIONAL:
            most = math.inf
        elif parameter.kind is parameter.KEYWORD_ONLY and parameter.default is parameter.empty:
            return 1, 0
    return least, most
