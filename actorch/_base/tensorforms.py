"""The forms a tensor takes inside a message's bytes, and the kinds of tensor that have none.

A small plain CPU tensor is *inlined*: its dtype code, shape and data, read
with its conjugate and negative bits resolved (a conjugate view's memory holds
the values before the flip). A sparse tensor (COO, CSR, CSC, BSR, BSC), and a
quantized one bound for another process, travel as their *parts*: a sparse
tensor's size and index and value tensors, a quantized one's integers, scale
and zero point. The parts take the tensor path like any other tensor, and the
receiver rebuilds the tensor from them, checking a sparse one's invariants.
torch RPC carries the rest as it is (dense tensors, conjugate and negative
views, jagged nested tensors). The few kinds that have no faithful form are
refused, with the reason and the fix (:func:`refusal`).

What torch RPC's own tensor path does with each kind (torch 2.13):
conjugate and negative views, jagged nested tensors and non-empty quantized
ones arrive right; sparse COO tensors arrive right too, but a sparse tensor
has no ``nbytes``, which sizing a message needs. A compressed sparse (CSR, CSC,
BSR, BSC), strided nested, MKL-DNN or efficient-zero tensor makes its
serializer throw from a C++ callback, which aborts the sending process; an
empty quantized tensor aborts the receiving one. A meta tensor is refused as
a tensor off the CPU.
"""

from __future__ import annotations

import ctypes
import functools
import math
import struct
from typing import Any

import torch

from actorch._base.errors import SerializationError

__all__ = [
    "INLINE_TENSOR_BYTES",
    "from_inline",
    "from_parts",
    "inlinable",
    "inline",
    "parts",
    "refusal",
]

INLINE_TENSOR_BYTES = 32 * 1024
"""Largest tensor (in bytes of data) that travels inside a message's bytes to another process.

Measured here with torch RPC over TensorPipe's uv transport: a tensor of its
own costs 40-90 us more CPU at each end than the same bytes inside the message,
up to about 64 KiB; at 256 KiB the two cost the same.
"""

_INLINE_DTYPES: tuple[torch.dtype, ...] = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.complex128,
)
_INLINE_CODES = {dtype: bytes((code,)) for code, dtype in enumerate(_INLINE_DTYPES)}
_INLINE_ITEMSIZES = tuple(dtype.itemsize for dtype in _INLINE_DTYPES)
_MAX_RANK = 255  # the rank is one byte

_SPARSE_LAYOUTS: tuple[torch.layout, ...] = (
    torch.sparse_coo,
    torch.sparse_csr,
    torch.sparse_csc,
    torch.sparse_bsr,
    torch.sparse_bsc,
)
_SPARSE_CODES = {layout: code for code, layout in enumerate(_SPARSE_LAYOUTS)}
_ROW_COMPRESSED = (torch.sparse_csr, torch.sparse_bsr)
_PER_TENSOR = 16  # codes of quantized tensors' parts, after the sparse layouts'
_PER_CHANNEL = 17
_QUANTIZED_DTYPES = (torch.quint8, torch.qint8, torch.qint32)  # one integer per value, which int_repr gives


def inlinable(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``, a strided CPU tensor of class ``torch.Tensor``, travels inside the message's bytes.

    It must be small, of a plain dtype and need no autograd: a tensor that
    requires grad keeps torch RPC's path, which distributed autograd records.
    """
    return (
        tensor.dtype in _INLINE_CODES
        and not tensor.requires_grad
        and tensor.nbytes <= INLINE_TENSOR_BYTES
        and tensor.dim() <= _MAX_RANK
    )


def inline(tensor: torch.Tensor) -> bytes:
    """Dtype code, rank, shape and data of ``tensor`` (an :func:`inlinable` one), in one piece of bytes.

    The data is read straight from memory: through NumPy, the sender's tensor
    would become one whose storage can no longer be resized.
    """
    # A conjugate or negative view shares memory holding the values before the flip.
    if tensor.is_conj() or tensor.is_neg() or not tensor.is_contiguous():
        tensor = tensor.resolve_conj().resolve_neg().contiguous()
    shape = tensor.shape
    rank = len(shape)
    header = _INLINE_CODES[tensor.dtype] + _header_format(rank).pack(rank, *shape)
    size = tensor.nbytes
    address = tensor.data_ptr()
    if size and not address:  # an efficient-zero tensor: zeros with no memory behind them
        return header + bytes(size)
    return header + ctypes.string_at(address, size)


def from_inline(payload: bytes) -> torch.Tensor:
    """The tensor :func:`inline` wrote, in fresh memory of its own (writable and resizable).

    The header is checked against the data before anything is allocated, so
    a malformed one cannot make the receiver reserve memory the bytes do not hold.

    Raises:
        SerializationError: If the header is malformed or does not fit the data.
    """
    try:
        code, rank = payload[0], payload[1]
        dtype = _INLINE_DTYPES[code]
        shape = _shape_format(rank).unpack_from(payload, 2)
    except (IndexError, struct.error):
        raise SerializationError(f"an inlined tensor came with a malformed header ({len(payload)} bytes)") from None
    start = 2 + 8 * rank
    size = len(payload) - start
    if math.prod(shape) * _INLINE_ITEMSIZES[code] != size:
        raise SerializationError(f"an inlined tensor of shape {shape} came with {size} bytes of data")
    tensor = torch.empty(shape, dtype=dtype)
    if size:
        ctypes.memmove(tensor.data_ptr(), payload[start:], size)
    return tensor


@functools.cache
def _header_format(rank: int) -> struct.Struct:
    """The rank (one byte) and sizes of a shape of ``rank`` dimensions, as written."""
    return struct.Struct(f"<B{rank}q")


@functools.cache
def _shape_format(rank: int) -> struct.Struct:
    """The sizes of a shape of ``rank`` dimensions, as read: unsigned, so a negative one is a huge one."""
    return struct.Struct(f"<{rank}Q")


def refusal(tensor: torch.Tensor) -> str | None:
    """Why ``tensor`` (sparse, nested, quantized or of another unusual layout) cannot travel; None if it can.

    Refused are the kinds that would not arrive as sent: a meta tensor (no
    data), a nested tensor of strided layout and an MKL-DNN tensor (torch RPC
    aborts the sending process on them; each has a form that travels), a
    sparse tensor that requires grad (distributed autograd cannot follow its
    parts) and a quantized one of a packed dtype (its integers do not rebuild it).
    """
    if tensor.is_meta:
        return "a meta tensor has no data to send"
    layout = tensor.layout
    if tensor.is_nested:
        return _STRIDED_NESTED if layout is torch.strided else None
    if layout in _SPARSE_CODES:
        return _SPARSE_WITH_GRAD if tensor.requires_grad else None
    if tensor.is_quantized:
        if tensor.dtype in _QUANTIZED_DTYPES:
            return None
        return f"a quantized tensor of dtype {tensor.dtype} cannot travel; send tensor.dequantize()"
    return f"a tensor of layout {layout} cannot travel; send tensor.to_dense()"


_STRIDED_NESTED = "a nested tensor of strided layout cannot travel; make it with layout=torch.jagged, which can"
_SPARSE_WITH_GRAD = (
    "a sparse tensor that requires grad cannot travel: distributed autograd cannot follow its parts; "
    "send tensor.detach() (and its gradient by another message), or a dense tensor"
)


def parts(tensor: torch.Tensor) -> list[Any]:
    """What rebuilds a sparse or quantized ``tensor`` that :func:`refusal` lets through: a code, tensors, numbers.

    Sparse: its size, whether it is coalesced (COO), and its index and value
    tensors, which share its memory (conjugation is never a lazy bit for
    sparse tensors). Quantized: its integers, and its scale and zero point,
    per tensor or per channel along an axis.
    """
    layout = tensor.layout
    if layout is torch.strided:  # quantized
        if tensor.qscheme() == torch.per_tensor_affine:
            return [_PER_TENSOR, tensor.int_repr(), tensor.q_scale(), tensor.q_zero_point()]
        return [
            _PER_CHANNEL,
            tensor.int_repr(),
            tensor.q_per_channel_scales(),
            tensor.q_per_channel_zero_points(),
            tensor.q_per_channel_axis(),
        ]
    code = _SPARSE_CODES[layout]
    size = list(tensor.shape)
    if layout is torch.sparse_coo:
        return [code, size, tensor.is_coalesced(), tensor._indices(), tensor._values()]
    if layout in _ROW_COMPRESSED:
        return [code, size, tensor.crow_indices(), tensor.col_indices(), tensor.values()]
    return [code, size, tensor.ccol_indices(), tensor.row_indices(), tensor.values()]


def from_parts(parts: Any) -> torch.Tensor:
    """The tensor whose :func:`parts` arrived, checked as it is rebuilt (a sparse one's indices in range).

    Raises:
        SerializationError: If the parts do not make a valid tensor.
    """
    try:
        code, *rest = parts
        if code == _PER_TENSOR:
            integers, scale, zero_point = rest
            return torch._make_per_tensor_quantized_tensor(integers, scale, zero_point)
        if code == _PER_CHANNEL:
            integers, scales, zero_points, axis = rest
            # torch takes any axis and any number of scales, and would read past them later.
            if not 0 <= axis < integers.dim() or not scales.shape == zero_points.shape == (integers.shape[axis],):
                raise ValueError(
                    f"a tensor of shape {tuple(integers.shape)} quantized along axis {axis} came with "
                    f"{tuple(scales.shape)} scales and {tuple(zero_points.shape)} zero points"
                )
            return torch._make_per_channel_quantized_tensor(integers, scales, zero_points, axis)
        layout = _SPARSE_LAYOUTS[code]
        if layout is torch.sparse_coo:
            size, coalesced, indices, values = rest
            return torch.sparse_coo_tensor(indices, values, size, is_coalesced=coalesced, check_invariants=True)
        size, compressed, plain, values = rest
        return torch.sparse_compressed_tensor(compressed, plain, values, size, layout=layout, check_invariants=True)
    except (RuntimeError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise SerializationError(f"a sparse or quantized tensor arrived malformed: {exc}") from None
