"""A file of named tensors plus a small header: no pickle, checked on load.

Layout: a 16-byte magic, the header length (8 bytes, little endian), the header
(msgpack, through the codec), padding, then each tensor's raw bytes at a 64-byte
aligned offset. The header lists every tensor's dtype, shape, offset and length
and a CRC-32 of the data, so a truncated or corrupt file is refused before any
tensor is handed out. Files are written to a temporary name and renamed, so a
crash while saving leaves the previous file whole.
"""

from __future__ import annotations

import os
import tempfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from actorch._base.codec import Codec
from actorch._base.errors import SnapshotError

__all__ = ["load_tensors", "save_tensors"]

MAGIC = b"ACTORCH-TENSORS1"
_ALIGN = 64
_LENGTH_BYTES = 8
_MAX_HEADER = 64 << 20


def _aligned(offset: int) -> int:
    return -(-offset // _ALIGN) * _ALIGN


def _raw(tensor: torch.Tensor) -> memoryview:
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().data if flat.numel() else memoryview(b"")


def save_tensors(path: str | os.PathLike[str], tensors: Mapping[str, torch.Tensor], meta: Any = None) -> int:
    """Write ``tensors`` and msgpack-native ``meta`` to ``path`` atomically; return the bytes written.

    Args:
        path: The file to write; replaced whole, never left half-written.
        tensors: Named tensors of any dtype and shape (copied to the CPU if needed).
        meta: Numbers, strings, bytes, lists and dicts to store beside them.

    Raises:
        SerializationError: If ``meta`` is not msgpack-native.
        TypeError: If a value of ``tensors`` is not a tensor.
    """
    codec = Codec(strict=True)
    raws: list[tuple[str, torch.Tensor, memoryview]] = []
    for name, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"tensor {name!r} is a {type(tensor).__qualname__}, not a tensor")
        raws.append((name, tensor, _raw(tensor)))
    # The header holds the offsets, which depend on the header's length: measure
    # it with the widest integers first, so the real one is never longer.
    widest = 2**63 - 1
    entries: list[list[Any]] = [
        [name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape), widest, len(raw)]
        for name, tensor, raw in raws
    ]
    probe, _ = codec.encode([meta, entries, widest, widest])
    offset = _aligned(len(MAGIC) + _LENGTH_BYTES + len(probe))
    entries = []
    crc = 0
    for name, tensor, raw in raws:
        entries.append([name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape), offset, len(raw)])
        crc = zlib.crc32(raw, crc)
        end = offset + len(raw)  # the file ends right after the last tensor, unpadded
        offset = _aligned(end)
    end = end if raws else offset
    header, _ = codec.encode([meta, entries, crc, end])
    target = Path(path)
    handle, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    temporary = Path(name)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(MAGIC + len(header).to_bytes(_LENGTH_BYTES, "little") + header)
            for (_, _, raw), entry in zip(raws, entries, strict=True):
                out.seek(entry[3])
                out.write(raw)
            out.truncate(end)
            out.flush()
            os.fsync(out.fileno())
        temporary.replace(target)
    finally:
        temporary.unlink(missing_ok=True)
    return end


def load_tensors(path: str | os.PathLike[str]) -> tuple[dict[str, torch.Tensor], Any]:
    """Read a file written by :func:`save_tensors`: its tensors by name, and its ``meta``.

    Raises:
        SnapshotError: If the file is not such a file, or is truncated or corrupt.
        OSError: If the file cannot be read.
    """
    data = bytearray(Path(path).read_bytes())
    where = f"{os.fspath(path)!r}"
    if data[: len(MAGIC)] != MAGIC:
        raise SnapshotError(f"{where} is not an actorch tensor file (bad magic bytes)")
    body = len(MAGIC) + _LENGTH_BYTES
    length = int.from_bytes(data[len(MAGIC) : body], "little")
    if not 0 < length <= min(_MAX_HEADER, len(data) - body):
        raise SnapshotError(f"{where} is truncated or corrupt (header length {length}, file {len(data)} bytes)")
    try:
        meta, entries, crc, end = Codec(strict=True).decode(bytes(data[body : body + length]), [])
        checked = [_entry(entry) for entry in entries]
    except Exception as exc:
        raise SnapshotError(f"{where} has a corrupt header: {exc}") from exc
    if end != len(data):
        raise SnapshotError(f"{where} is truncated or has trailing bytes ({len(data)} bytes, expected {end})")
    found = 0
    tensors: dict[str, torch.Tensor] = {}
    for name, _, _, offset, size in checked:
        if offset < body + length or offset + size > len(data) or offset % _ALIGN:
            raise SnapshotError(f"{where} is corrupt: tensor {name!r} lies outside the data")
        found = zlib.crc32(memoryview(data)[offset : offset + size], found)
    if found != crc:
        raise SnapshotError(f"{where} is corrupt: checksum mismatch")
    for name, dtype, shape, offset, size in checked:
        raw = torch.frombuffer(data, dtype=torch.uint8, count=size, offset=offset) if size else torch.empty(0)
        tensors[name] = raw.view(torch.uint8).view(dtype).reshape(shape) if size else torch.empty(shape, dtype=dtype)
    return tensors, meta


def _entry(entry: Any) -> tuple[str, torch.dtype, list[int], int, int]:
    name, dtype_name, shape, offset, size = entry
    dtype = getattr(torch, str(dtype_name), None)
    if not isinstance(name, str) or not isinstance(dtype, torch.dtype):
        raise ValueError(f"bad tensor entry {entry!r}")
    if not all(isinstance(n, int) and n >= 0 for n in (*shape, offset, size)):
        raise ValueError(f"bad tensor entry {entry!r}")
    expected = dtype.itemsize
    for n in shape:
        expected *= n
    if expected != size:
        raise ValueError(f"tensor {name!r}: {size} bytes do not fit shape {shape} of {dtype}")
    return name, dtype, list(shape), offset, size
