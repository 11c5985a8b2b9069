"""The kinds of transport, in one table, and the functions every launch path reaches them through.

Transports are plug-ins. Each kind is a module (or package) of ``_transport``
with its options record and one ``Kind`` (``kind``); ``KINDS`` lists them,
one line each. The launch layer imports this module and no kind's own: it
describes the node's place in the world (``WorldSpec``), passes the options
record the user chose, and calls :func:`open_transport`; a record of a kind
that wraps another opens the wrapped kind first. A record that crosses
processes through a rendezvous goes as json (:func:`options_to_json`), and
comes back as the same record (:func:`options_from_json`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from actorch._base.errors import UnsupportedError
from actorch._transport import faulty, inprocess
from actorch._transport.base import Transport
from actorch._transport.kind import Joining, Kind, KindOptions
from actorch._transport.torch_rpc import plugin as torch_rpc
from actorch._transport.world import WorldSpec

__all__ = [
    "DEFAULT_KIND",
    "KINDS",
    "at_exit",
    "default_options",
    "innermost",
    "kind_named",
    "kind_of",
    "open_transport",
    "options_from_json",
    "options_to_json",
    "prepare_join",
    "running",
]

KINDS: tuple[Kind[Any], ...] = (
    torch_rpc.KIND,
    inprocess.KIND,
    faulty.KIND,
)
"""Every kind of transport, by its place in this table: a new kind is one module and one line here."""

DEFAULT_KIND: Kind[Any] = torch_rpc.KIND
"""The kind a launch opens unless told otherwise, and whose rendezvous a process that joins meets first."""


def default_options() -> KindOptions:
    """The options of the default kind, as it makes them: ``TorchRpc()``."""
    options: KindOptions = DEFAULT_KIND.options()
    return options


def kind_named(name: str) -> Kind[Any]:
    """The kind called ``name``.

    Raises:
        ValueError: No kind of that name (the message lists them).
    """
    for kind in KINDS:
        if kind.name == name:
            return kind
    raise ValueError(f"no transport of kind {name!r} (there are: {', '.join(sorted(k.name for k in KINDS))})")


def kind_of(options: object) -> Kind[Any]:
    """The kind whose options record ``options`` is.

    Raises:
        TypeError: ``options`` is no kind's options record (the message names those there are).
    """
    for kind in KINDS:
        if type(options) is kind.options:
            return kind
    records = ", ".join(f"{kind.options.__name__}(...)" for kind in KINDS)
    raise TypeError(f"transport= takes a transport kind's options record ({records}), not {options!r}")


def innermost(options: object) -> object:
    """The options of the kind at the core of ``options``: those of the kind it wraps, and so on, or its own.

    Raises:
        TypeError: A record on the way is no kind's options record.
    """
    kind = kind_of(options)
    while kind.wraps is not None:
        options = kind.wraps(options)
        kind = kind_of(options)
    return options


def open_transport(spec: WorldSpec, options: object) -> Transport:
    """The transport that ``spec`` and ``options`` describe, not yet started; a wrapping kind's inner one first.

    Raises:
        TypeError: ``options`` is no kind's options record.
        ValueError: The kind cannot open such a world.
    """
    kind = kind_of(options)
    inner = None if kind.wraps is None else open_transport(spec, kind.wraps(options))
    return kind.open(spec, options, inner)


def options_to_json(options: object) -> dict[str, Any]:
    """``options``, of any kind, as json-ready data that names its kind."""
    kind = kind_of(options)
    return {"kind": kind.name, "options": options.to_json(options_to_json)}  # type: ignore[attr-defined]


def options_from_json(data: Mapping[str, Any]) -> Any:
    """The options record that :func:`options_to_json` made ``data`` from.

    Raises:
        ValueError: ``data`` names no kind, or holds what its record does not take.
    """
    if not isinstance(data, Mapping) or "kind" not in data or not isinstance(data.get("options"), Mapping):
        raise ValueError(f"not a transport's options: {data!r}")
    kind = kind_named(data["kind"])
    try:
        return kind.load(data["options"], options_from_json)
    except TypeError as exc:
        raise ValueError(f"not {kind.name}'s options: {data['options']!r} ({exc})") from exc


def prepare_join(
    host: str, port: int, timeout: float, *, invited: bool = False, options: object | None = None
) -> Joining:
    """Take a rank in the running world at ``host:port`` and read its settings, at ``options``' kind's rendezvous.

    ``options`` None (a process that does not know the world's kind yet):
    at the default kind's, where every world a launch spreads over
    processes meets, whatever kind its nodes then open.

    Raises:
        UnsupportedError: The kind takes no process into a running world.
        JoinError: Nothing answers there in time, or the world takes no new nodes.
    """
    kind = DEFAULT_KIND if options is None else kind_of(options)
    while kind.prepare_join is None and kind.wraps is not None:
        options = kind.wraps(options)
        kind = kind_of(options)
    if kind.prepare_join is None:
        raise UnsupportedError(f"a world on {kind.name} takes no process that joins it")
    return kind.prepare_join(host, port, timeout, invited)


def at_exit() -> None:
    """Take down what every kind keeps per process (an interpreter that exits with a system up)."""
    for kind in KINDS:
        kind.at_exit()


def running() -> bool:
    """Whether this process runs a node of a kind that allows only one per process."""
    return any(kind.running() for kind in KINDS)
