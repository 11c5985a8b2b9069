"""A kind of transport, as one record: its name, its options record, and what the launch may ask of it.

Each kind is a module (or package) of ``_transport`` that defines its options
record (what users pass as ``run(transport=...)``) and one ``Kind`` that says
how to open a node's transport from a ``WorldSpec`` and those options, how a
process prepares to join a running world of it, and what must happen at the
interpreter's exit. ``kinds.KINDS`` lists them; the launch layer imports that
table and this module only, never a kind's own modules.

An options record is plain data, frozen, that pickles (it travels to the
processes a launch spawns) and turns into json and back (it travels to the
processes that join a running world, through its rendezvous). The launch asks
it the few questions that depend on the kind (``KindOptions``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, Self, TypeVar

if TYPE_CHECKING:
    from actorch._transport.base import Transport
    from actorch._transport.world import WorldSpec

__all__ = ["Dump", "Joining", "Kind", "KindOptions", "Load"]

Dump = Callable[[object], dict[str, Any]]
"""Turns any kind's options record into json-ready data, its kind named (``kinds.options_to_json``)."""

Load = Callable[[Mapping[str, Any]], Any]
"""Rebuilds any kind's options record from what ``Dump`` made (``kinds.options_from_json``)."""

Joining = tuple[int, dict[str, Any]]
"""What preparing a join gives: the rank the newcomer takes, and the settings its world runs with (json-ready)."""


class KindOptions(Protocol):
    """What the launch asks of every kind's options record."""

    def refuses_elastic(self) -> str | None:
        """Why a world on these options cannot take nodes while it runs, when asked (``elastic=True``); None: it can."""
        ...

    def fixes_world(self) -> str | None:
        """Why a local launch on these options runs on a world fixed at its start (no ``add_nodes``); None: it grows."""
        ...

    def joining(self, timeout: float | None = None) -> Self:
        """These options as a newcomer to a running world runs with them, let in within ``timeout`` s (None: as set)."""
        ...

    def to_json(self, dump: Dump) -> dict[str, Any]:
        """These options as json-ready data (``dump`` turns a record they hold, of any kind, into data too)."""
        ...


OptionsT = TypeVar("OptionsT")


def _nothing() -> None:
    """At exit, a kind that holds nothing past its transports' ``close`` does nothing."""


def _never() -> bool:
    """A kind of which a process may run any number of nodes."""
    return False


@dataclass(frozen=True)
class Kind(Generic[OptionsT]):
    """One kind of transport, as the table lists it.

    Attributes:
        name: Its name (``"torch_rpc"``), as its options are named in json.
        options: Its options record's type; a user picks the kind by passing one
            (``run(transport=TorchRpc(...))``).
        open: Makes a node's transport from a spec and options, not yet started;
            ``inner`` is the transport of the kind it wraps, opened first (None
            for a kind that wraps none).
        load: Rebuilds its options from what their ``to_json`` made (``Load``
            rebuilds a record they hold, of any kind).
        wraps: Of a kind that wraps another (faults, a second path), the options
            of the wrapped kind, held in its own.
        prepare_join: Takes a rank in the running world whose rendezvous is at
            ``host:port`` within ``timeout`` seconds (``invited``: the system
            started this process itself), and reads the settings it runs with;
            None for a kind that no process joins.
        at_exit: Takes down what the kind keeps per process, for an interpreter
            that exits with a system still up (bounded, never raises).
        running: Whether this process runs a node of this kind now, where a
            process can run only one (torch RPC).
    """

    name: str
    options: type[OptionsT]
    open: Callable[[WorldSpec, OptionsT, Transport | None], Transport]
    load: Callable[[Mapping[str, Any], Load], OptionsT]
    wraps: Callable[[OptionsT], object] | None = None
    prepare_join: Callable[[str, int, float, bool], Joining] | None = None
    at_exit: Callable[[], None] = _nothing
    running: Callable[[], bool] = _never

    def __repr__(self) -> str:
        return f"<Kind {self.name} options={self.options.__name__}>"
