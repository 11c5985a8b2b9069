"""The wire codec: values to msgpack bytes plus a side list, and back; each tensor on a channel of the data plane.

A value is packed with msgpack. Each tensor in it bound for another process
goes on the first channel of the node's :class:`~actorch._base.channels.plane.DataPlane`
that carries it (metadata for an empty one, inside the bytes for a small one,
by reference in shared memory on the same host, through a device map or staged
for a GPU one, else by value on the transport's own path), and the bytes hold
what that channel needs to give it back on arrival. Objects only the
transport can carry (torch RRefs), and every tensor bound for this very
process, ride in the side list untouched. Tuples, and classes registered with
:func:`register_extension` (actor refs) or :func:`serializable` (dataclasses),
are native, and so is a ``tensordict.TensorDict``
(:mod:`actorch._base.tensordicts`), its tensors on channels like any other;
anything else msgpack cannot carry is pickled, unless the codec is strict,
which refuses it with ``SerializationError``.

Every tensor arrives bitwise as it was sent, or is refused with
``SerializationError`` naming where it sits in the value: the forms a tensor
takes in the bytes (inlined; sparse and quantized ones as parts) and the kinds refused are in
:mod:`actorch._base.tensorforms`. The decoder takes bytes from other processes:
whatever they hold, it raises ``SerializationError`` and nothing else, and it
allocates no more than the bytes can justify.

One module past 600 lines, on purpose: the encoder and the decoder are one format, the extension
codes and the tensor forms read and written in mirror image; split, each side would lose sight of
the other it must match byte for byte.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pickle
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from types import MappingProxyType
from typing import Any, TypeVar

import msgpack
import torch

from actorch._base.channels.plane import DataPlane
from actorch._base.channels.route import TensorRoute
from actorch._base.devices import accelerator
from actorch._base.errors import SerializationError
from actorch._base.tensordicts import is_tensordict, layout, rebuild
from actorch._base.tensorforms import INLINE_TENSOR_BYTES, from_inline, from_parts, parts, refusal

__all__ = [
    "INLINE_TENSOR_BYTES",
    "MAX_NESTING",
    "OWN_CODES",
    "Codec",
    "Shared",
    "current_context",
    "register_extension",
    "register_side_type",
    "serializable",
    "shared",
    "tensor_path",
    "value_path",
]

# Codes 0, 4, 5 and 8-15 are the data plane's channels' (channels.base.CHANNEL_CODES).
_TUPLE = 1
_PICKLE = 2
_SIDE = 3  # an item of the side list as it is: a transport object (RRef), or a tensor for this very process
_INLINE = 5  # the inline channel's: a small CPU tensor carried in the bytes (decoded here, without a call)
_PARTS = 6  # a sparse or quantized tensor as the parts that rebuild it (index, value, integer tensors...)
_TENSORDICT = 7  # a tensordict.TensorDict: batch size, device, names, lock, then its entries
_SHARED = 12  # a value sent with shared(): its tensors placed once for every receiver of a host or GPU
_FIRST_OWN_CODE = 16
_FIRST_USER_CODE = 32

# actorch's own extension codes, the one place they are given out: a class named
# here registers with its code and no other, and no other class may take one of
# 16..31. A new type takes the next free code here.
OWN_CODES: Mapping[str, int] = MappingProxyType(
    {
        "actorch._actors.ref.ActorRef": 16,
        "actorch._stock.replay.Sample": 17,
        "actorch._stock.parameter_server.Parameters": 18,
        "actorch._stock.observer.Rollout": 19,
        "actorch._stock.episodes.EpisodeStats": 20,
        "actorch._actors.restart.Restart": 21,
        "actorch._actors.restart.ActorExit": 22,
        "actorch._stock.batch.Batch": 23,
        "actorch._actors.spawn_request.SpawnRequest": 24,
        "actorch._actors.where.Where": 25,
        "actorch._actors.node_request.NodeRequest": 26,
        "actorch._actors.relocation.spec.RelocationSpec": 30,
        "actorch._actors.relocation.movable.MovableRef": 31,
    }
)

T = TypeVar("T")

_INT_RANGE = "-2**63 to 2**64 - 1"
"""The ints msgpack carries (its signed and unsigned 64-bit forms)."""

MAX_NESTING = 32
"""Deepest chain of tuples and extension values (refs, dataclasses, TensorDicts, tensors as parts) in a message.

Each level is decoded by a msgpack call of its own, which takes 40-50 KiB of
C stack: 200 levels, in 700 bytes, overflowed a thread's 8 MiB stack and
killed the process (150 did not). Plain lists and dicts do not count: msgpack
nests them without recursing.
"""

Encoder = Callable[[Any], Any]
Decoder = Callable[[Any, Any], Any]
_encoders: dict[type, tuple[int, Encoder]] = {}
_decoders: dict[int, Decoder] = {}
_side_types: tuple[type, ...] = ()
_serializable_classes: dict[int, type] = {}
_decoding_context: ContextVar[Any] = ContextVar("actorch_decoding_context", default=None)


def current_context() -> Any:
    """The context of the decode in progress (for objects rebuilt by pickle), or None."""
    return _decoding_context.get()


def register_extension(cls: type, code: int | None, encode: Encoder, decode: Decoder) -> None:
    """Make instances of ``cls`` travel natively (also in strict mode).

    Args:
        cls: The exact class to encode.
        code: Extension code, 32 to 127, unique per class; None for one of
            actorch's own classes, whose code is in ``OWN_CODES``.
        encode: Turns an instance into msgpack-native data (no tensors).
        decode: Rebuilds the instance from that data and the decoding context.

    Raises:
        ValueError: If the code is out of range, reserved for actorch or taken.
    """
    code = _checked_code(cls, code)
    if _decoders.get(code, decode) is not decode:
        raise ValueError(f"extension code {code} is taken")
    _encoders[cls] = (code, encode)
    _decoders[code] = decode


def register_side_type(cls: type) -> None:
    """Make instances of ``cls`` (and subclasses) ride the side list untouched, like tensors.

    For objects only the transport knows how to send (torch RRefs, which torch
    RPC's own pickler must carry).
    """
    global _side_types  # noqa: PLW0603 - registered once per transport module, read per value
    if cls not in _side_types:
        _side_types = (*_side_types, cls)


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _checked_code(cls: type, code: int | None) -> int:
    """``cls``'s extension code: ``code``, or its entry in ``OWN_CODES`` (which must agree)."""
    own = OWN_CODES.get(_qualified(cls))
    if own is not None:
        if code not in (None, own):
            raise ValueError(f"{_qualified(cls)} has extension code {own} (OWN_CODES), not {code}")
        return own
    if code is None:
        raise ValueError(f"{_qualified(cls)} needs an extension code: only actorch's own classes may omit it")
    if _FIRST_OWN_CODE <= code < _FIRST_USER_CODE:
        taken = next((name for name, value in OWN_CODES.items() if value == code), "actorch")
        raise ValueError(f"extension code {code} is reserved for {taken}: use 32..127")
    if not _FIRST_USER_CODE <= code <= 127:
        raise ValueError(f"extension code must be in 32..127, not {code}")
    return code


def serializable(code: int | None = None) -> Callable[[type[T]], type[T]]:
    """Class decorator: instances of this dataclass travel natively, in strict mode too.

    The fields (those ``__init__`` takes) are encoded in order, tensors among them
    through the tensor path, and the instance is rebuilt by calling the class.
    Codes 16 to 31 are actorch's own (``OWN_CODES``); use 32 to 127.

    Args:
        code: The extension code, unique per class (None: one of actorch's own,
            which takes its code from ``OWN_CODES``).

    Raises:
        TypeError: If the class is not a dataclass, or the decorator was
            written without its code (``@serializable`` on a class): at once,
            not when the class is first used.
        ValueError: If the code is out of range or taken by another class.
    """
    if isinstance(code, type):  # @serializable without parentheses: it would replace the class with register
        raise TypeError(
            f"@serializable needs an extension code: write @actorch.serializable(32) above class "
            f"{code.__qualname__} (32 to 127, one per class)"
        )

    def register(cls: type[T]) -> type[T]:
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"@serializable needs a dataclass, not {cls.__qualname__}")
        names = [field.name for field in dataclasses.fields(cls) if field.init]
        own = _checked_code(cls, code)

        def encode(obj: Any) -> list[Any]:
            return [getattr(obj, name) for name in names]

        def decode(data: Any, context: Any) -> Any:
            return cls(**dict(zip(names, data, strict=True)))

        registered = _encoders.get(cls)
        if registered is not None and registered[0] == own:
            return cls  # the very same class decorated again
        previous = _serializable_classes.get(own)
        if previous is not None and _qualified(previous) == _qualified(cls):
            # The class was defined again (its module reloaded): the new one takes over.
            _encoders.pop(previous, None)
            _decoders.pop(own, None)
        register_extension(cls, own, encode, decode)
        _serializable_classes[own] = cls
        return cls

    return register


_STANDARD = DataPlane.standard()


class Shared:
    """A value sent to many receivers whose tensors are placed once per host or GPU; made by :func:`shared`.

    Send the same ``Shared`` object in several messages (a stream item each
    watcher gets, a result many callers pull, a tell to many actors), and a
    tensor in it that a channel places apart from the message (a segment of
    shared memory, a GPU block) is placed once for all of them and lent to
    each receiver that reaches it: the receivers of one host (or one GPU)
    share one copy, and must treat it as read-only. Elsewhere, and between
    actors of one process, it travels as its value does. Receivers get the
    value itself, never the wrapper.

    Attributes:
        value: The value sent.
    """

    __slots__ = ("_placements", "value")

    def __init__(self, value: Any) -> None:
        self.value = value
        self._placements: dict[Any, Any] = {}

    def __repr__(self) -> str:
        return f"<actorch.Shared {type(self.value).__qualname__}, {len(self._placements)} tensors placed>"


def shared(value: Any) -> Shared:
    """``value``, to be sent to many receivers with its tensors placed once per host or GPU (see :class:`Shared`).

    Keep the object and send it again: what it placed is reused while it lives.
    """
    return Shared(value)


class Codec:
    """Encodes and decodes message bodies; one per node, strict or not, with the node's data plane."""

    __slots__ = ("_plain", "plane", "strict")

    def __init__(self, *, strict: bool = False, plane: DataPlane | None = None) -> None:
        self.strict = strict
        self.plane = plane if plane is not None else _STANDARD
        self._plain = msgpack.Packer(use_bin_type=True)

    def __repr__(self) -> str:
        return f"<Codec strict={self.strict} {self.plane}>"

    def encode(
        self,
        value: Any,
        *,
        copy_tensors: bool = False,
        route: TensorRoute | None = None,
        arguments: bool = False,
        shared: dict[Any, Any] | None = None,
    ) -> tuple[bytes, list[Any]]:
        """Encode ``value``; return its bytes and the tensors it references, in order.

        Args:
            value: Any value msgpack, the registered extensions or pickle can carry.
            copy_tensors: Send private copies of the tensors, so the sender may
                mutate its own at once (used by fire-and-forget sends).
            route: The destination node: each tensor takes the first channel
                of the data plane that carries it there. None leaves every
                tensor as it is (the destination shares this process).
            arguments: ``value`` is ``[args, kwargs]``: a refused tensor's path
                is named ``args[0]...`` rather than ``value[0][0]...``.
            shared: One dict for every destination of one multicast: a tensor
                a channel placed apart from the message (shared memory, a GPU
                block) for one is lent as it is to the others it reaches,
                which share it read-only. None: each message its own copy.

        Raises:
            SerializationError: If a part of ``value`` cannot be encoded.
        """
        encoding = _Encoding(self.strict, value, copy_tensors, route, arguments, self.plane, shared)
        try:
            data = encoding.nested(value)
        except SerializationError:
            raise
        except (TypeError, ValueError, OverflowError) as exc:
            raise SerializationError(f"cannot serialize value: {exc}") from exc
        if encoding.staged is not None:  # one wait per device, after every copy of the message was queued
            for device in encoding.staged:
                accelerator().synchronize(device)
        return data, encoding.tensors

    def encode_plain(self, value: Any) -> bytes:
        """Encode msgpack-native ``value`` (no tuples, tensors or extensions) quickly."""
        return self._plain.pack(value)

    @staticmethod
    def decode_plain(data: bytes) -> Any:
        """Decode bytes made by :meth:`encode_plain` (tuples come back as lists)."""
        return msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=False)

    def drop(self, data: bytes | None) -> None:
        """Bytes made by :meth:`encode` will never be decoded (their message was dropped): let go of what they lend.

        A tensor sent by reference (shared memory) keeps its sender's segment
        until it is freed; one whose message is dropped unread is let go here.
        Never raises: what cannot be read lends nothing this node can give back.
        """
        if data is not None and self.plane.lends:
            _drop(self.plane, data, 0)

    def decode(self, data: bytes, tensors: list[Any], context: Any = None, device: torch.device | None = None) -> Any:
        """Decode bytes made by :meth:`encode`, taking tensors from ``tensors``.

        Args:
            data: The encoded bytes.
            tensors: The side list (tensors, transport objects) that travelled with them.
            context: Passed to extension decoders (the receiving node, for refs).
            device: Where tensors staged through host memory go (the receiving
                actor's device); None or the CPU leaves them on the host.

        Raises:
            SerializationError: If the bytes are malformed, or strict mode meets pickle.
        """
        decoding = _Decoding(self.strict, tensors, context, device, self.plane)
        token = _decoding_context.set(context)
        try:
            return decoding.unpack(data)
        except SerializationError:
            raise
        except Exception as exc:
            raise SerializationError(f"cannot decode message: {_describe(exc)}") from exc
        finally:
            _decoding_context.reset(token)


class _Encoding:
    """One value being encoded: the side list it fills, and how each tensor in it travels (an ``Outgoing``)."""

    __slots__ = (
        "arguments",
        "copy",
        "depth",
        "plane",
        "route",
        "settled",
        "shared",
        "staged",
        "strict",
        "tensors",
        "value",
    )

    def __init__(
        self,
        strict: bool,
        value: Any,
        copy_tensors: bool,
        route: TensorRoute | None,
        arguments: bool,
        plane: DataPlane,
        shared: dict[Any, Any] | None = None,
    ) -> None:
        self.shared = shared
        self.strict = strict
        self.value = value
        self.copy = copy_tensors
        self.route = route
        self.arguments = arguments
        self.plane = plane
        self.tensors: list[Any] = []
        self.staged: set[torch.device] | None = None  # made by the first staged tensor: most messages have none
        self.settled: set[torch.device] | None = None
        self.depth = 0

    def nested(self, inner: Any) -> bytes:
        """``inner`` packed on its own (a packer's buffer is not reentrant), at most ``MAX_NESTING`` deep."""
        if self.depth > MAX_NESTING:  # the receiver could not decode it
            raise SerializationError(
                "the value nests tuples or extension values (refs, dataclasses, TensorDicts, tensors sent as parts) "
                f"more than {MAX_NESTING} deep; use lists or dicts for deeper structures"
            )
        self.depth += 1
        try:
            return msgpack.packb(inner, default=self.default, use_bin_type=True, strict_types=True)
        finally:
            self.depth -= 1

    def default(self, obj: Any) -> Any:
        """What msgpack cannot pack itself: tensors, tuples, side objects, extensions, pickles."""
        if isinstance(obj, torch.Tensor):
            return self.tensor(obj)
        if type(obj) is tuple or type(obj) is Shared:
            return self.wrapped(obj)
        if _side_types and isinstance(obj, _side_types):
            return msgpack.ExtType(_SIDE, self.add(obj).to_bytes(4, "little"))
        registered = _encoders.get(type(obj))
        if registered is not None:
            code, encode = registered
            return msgpack.ExtType(code, self.nested(encode(obj)))
        if is_tensordict(obj):  # recognised here, past every common type, so other values pay nothing for it
            return msgpack.ExtType(_TENSORDICT, self.nested(layout(obj)))
        if self.strict:
            if type(obj) is int:  # an int msgpack could not pack: it takes 64 bits at most
                raise SerializationError(
                    f"strict serialization cannot send the int {obj}: it is wider than 64 bits, and ints travel "
                    f"natively from {_INT_RANGE}; send it as a str (or with strict=False, which pickles it)"
                )
            raise SerializationError(
                f"{self.prefix(obj)}strict serialization refuses {type(obj).__qualname__} values; send "
                "tensors, numbers, str, bytes, lists, tuples, dicts, actor refs or @serializable dataclasses"
            )
        try:
            return msgpack.ExtType(_PICKLE, pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
        except Exception as exc:
            what = f"{self.prefix(obj)}cannot serialize {type(obj).__qualname__} value"
            raise SerializationError(f"{what}: {exc}") from exc

    def wrapped(self, obj: tuple[Any, ...] | Shared) -> msgpack.ExtType:
        """A tuple (its items, to come back a tuple), or a :class:`Shared` value (its tensors placed once)."""
        if type(obj) is tuple:
            return msgpack.ExtType(_TUPLE, self.nested(list(obj)))
        assert isinstance(obj, Shared)
        if self.route is None:  # this very process: the value as it is
            return msgpack.ExtType(_SHARED, self.nested(obj.value))
        outer, self.shared = self.shared, obj._placements
        try:
            return msgpack.ExtType(_SHARED, self.nested(obj.value))
        finally:
            self.shared = outer

    def prefix(self, obj: Any) -> str:
        """Where ``obj`` sits in the value, as a refusal's prefix (``args[0]['env']: ``); empty if it is not found."""
        found = value_path(self.value, obj, arguments=self.arguments)
        return "" if found is None else f"{found}: "

    def tensor(self, obj: torch.Tensor) -> msgpack.ExtType:
        """A tensor: on the side list as it is (this process), as its parts, refused, or on a channel."""
        if obj.layout is not torch.strided or obj.is_nested:
            return self.unusual(obj)
        route = self.route
        if route is None:  # the destination shares this process: the very tensor (a copy, for a tell)
            kept = obj.detach().clone() if self.copy else obj
            return msgpack.ExtType(_SIDE, self.add(kept).to_bytes(4, "little"))
        if obj.is_quantized:  # as its parts: torch RPC's receiver aborts on an empty one
            return self.unusual(obj)
        code, packed, payload = self.plane.carry(obj, route, self)
        return msgpack.ExtType(code, msgpack.packb(payload, use_bin_type=True) if packed else payload)

    def unusual(self, obj: torch.Tensor) -> msgpack.ExtType:
        """A sparse, nested, quantized or other unusual tensor: as its parts, as it is, or refused."""
        why = refusal(obj)
        if why is not None:
            raise SerializationError(f"{self.where(obj)}: {why}")
        if obj.is_nested:  # jagged: torch RPC carries it as it is
            kept = obj.detach().clone() if self.copy else obj
            return msgpack.ExtType(_SIDE, self.add(kept).to_bytes(4, "little"))
        return msgpack.ExtType(_PARTS, self.nested(parts(obj)))

    def add(self, item: Any) -> int:
        """Put ``item`` on the side list; its index there."""
        self.tensors.append(item)
        return len(self.tensors) - 1

    def staged_on(self, device: torch.device) -> None:
        """Copies out of ``device`` were queued: the message waits for them once before it leaves."""
        if self.staged is None:
            self.staged = set()
        self.staged.add(device)

    def settle(self, device: torch.device) -> None:
        """Wait, once per message and device, for the work queued on ``device`` so far."""
        if self.settled is None:
            self.settled = set()
        if device not in self.settled:
            self.settled.add(device)
            accelerator().synchronize(device)

    def where(self, tensor: torch.Tensor) -> str:
        """Where ``tensor`` sits in the value, for an error."""
        return tensor_path(self.value, tensor, arguments=self.arguments)


class _Decoding:
    """One message being decoded: its side list, the context for extensions, how deep it has gone (an ``Arrival``)."""

    __slots__ = ("context", "depth", "device", "plane", "strict", "tensors")

    def __init__(
        self, strict: bool, tensors: list[Any], context: Any, device: torch.device | None, plane: DataPlane
    ) -> None:
        self.strict = strict
        self.tensors = tensors
        self.context = context
        self.device = device
        self.plane = plane
        self.depth = 0

    def unpack(self, payload: bytes) -> Any:
        """``payload`` unpacked, at most ``MAX_NESTING`` deep (each level takes C stack)."""
        if self.depth > MAX_NESTING:
            raise SerializationError(f"the message nests tuples or extension values more than {MAX_NESTING} deep")
        self.depth += 1
        try:
            return msgpack.unpackb(payload, ext_hook=self.ext_hook, raw=False, strict_map_key=False)
        finally:
            self.depth -= 1

    def ext_hook(self, code: int, payload: bytes) -> Any:
        """The value an extension stands for (the common ones first)."""
        if code == _INLINE:
            return from_inline(payload)
        if code == _TUPLE:
            return tuple(self.unpack(payload))
        if code == _SIDE:
            index = int.from_bytes(payload, "little")
            if index >= len(self.tensors):
                raise SerializationError(f"a message names side item {index} of {len(self.tensors)}")
            return self.tensors[index]
        channel = self.plane.receiver(code)
        if channel is not None:
            data = msgpack.unpackb(payload, raw=False, use_list=True) if channel.packed else payload
            return channel.receive(data, self)
        return self.rarer(code, payload)

    def rarer(self, code: int, payload: bytes) -> Any:
        """The value of a sparse tensor, TensorDict, pickle or registered extension."""
        if code == _PARTS:
            return from_parts(self.unpack(payload))
        if code == _SHARED:
            return self.unpack(payload)
        if code == _TENSORDICT:
            return rebuild(self.unpack(payload))
        if code == _PICKLE:
            if self.strict:
                raise SerializationError("strict serialization refuses a pickled value")
            return pickle.loads(payload)  # noqa: S301 - peers are trusted (docs/concepts)
        decode = _decoders.get(code)
        if decode is None:
            if code < _FIRST_OWN_CODE:
                return self.plane.receive(code, None, self)  # a channel this node does not use: it says which
            raise SerializationError(f"unknown extension code {code}")
        return decode(self.unpack(payload), self.context)


def _drop(plane: DataPlane, data: bytes, depth: int) -> None:
    """Let go of the lends in ``data``, walking nested extensions (not pickles) up to ``MAX_NESTING`` deep."""

    def settle(code: int, payload: bytes) -> None:
        channel = plane.receiver(code)
        if channel is not None:
            if channel.packed:
                channel.drop(msgpack.unpackb(payload, raw=False, use_list=True))
        elif code not in (_PICKLE, _SIDE) and depth < MAX_NESTING:
            _drop(plane, payload, depth + 1)

    with contextlib.suppress(Exception):  # what cannot be read lends nothing
        msgpack.unpackb(data, ext_hook=settle, raw=False, strict_map_key=False)


def _describe(exc: Exception) -> str:
    """``exc``'s type and message; not its repr, which may hold a half-decoded value whose own repr raises."""
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:  # noqa: BLE001 - a message that cannot be formatted still names its type
        return type(exc).__name__


def tensor_path(value: Any, target: torch.Tensor, *, arguments: bool = False) -> str:
    """Where ``target`` sits inside ``value``, as ``args[0]['obs']`` (``arguments``) or ``value[1].field``."""
    return value_path(value, target, arguments=arguments) or "a tensor"


def value_path(value: Any, target: object, *, arguments: bool = False) -> str | None:
    """Where the object ``target`` (itself, not an equal one) sits inside ``value``; None if it is not there.

    The path reads as Python would reach it: ``args[0]['obs']`` when ``value``
    is a call's ``[args, kwargs]`` (``arguments``), else ``value[1].field``.
    Lists, tuples, dicts, dataclasses and TensorDicts are looked into.
    """
    found = _find(value, target, [])
    if found is None:
        return None
    if arguments and found and found[0] in ("[0]", "[1]"):
        head = "args" if found[0] == "[0]" else "kwargs"
        return head + "".join(found[1:])
    return "value" + "".join(found)


def _find(value: Any, target: object, path: list[str]) -> list[str] | None:
    if value is target:
        return path
    if isinstance(value, (list, tuple)):
        items: Any = ((f"[{index}]", item) for index, item in enumerate(value))
    elif isinstance(value, dict):
        items = ((f"[{key!r}]", item) for key, item in value.items())
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = ((f".{field.name}", getattr(value, field.name)) for field in dataclasses.fields(value))
    elif is_tensordict(value):
        items = ((f"[{key!r}]", item) for key, item in value.items())
    else:
        return None
    for step, item in items:
        found = _find(item, target, [*path, step])
        if found is not None:
            return found
    return None
