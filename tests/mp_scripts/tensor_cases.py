"""Tensors of every kind the wire carries, drawn by hypothesis, and their bits, to compare what was sent and what came.

Shared by ``tests/base/test_tensorforms.py`` (the codec in one process) and
``tensor_fidelity.py`` (a real torch RPC world, with and without the fast
lane). A drawn tensor covers: every dtype the codec sends (complex, bool,
float8, complex32 and the unsigned ones included), shapes from 0-d and empty to
three dimensions, views (transposed, sliced with steps, narrowed with an offset,
expanded), conjugate and negative bits, tensors large enough for torch RPC's own
path, tensors that require grad, and the layouts that travel: sparse COO
(coalesced or not, hybrid), CSR, CSC, BSR, BSC, quantized (per tensor and per
channel) and jagged nested.
"""

from __future__ import annotations

import ctypes
import math
import warnings
from typing import Any

import torch
from hypothesis import strategies as st

import actorch

INLINE_DTYPES = [
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
]
OTHER_DTYPES = [torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn, torch.float8_e5m2, torch.complex32]
"""Dtypes that never ride inside the bytes: torch RPC carries them."""
DTYPES = INLINE_DTYPES + OTHER_DTYPES
LARGE_BYTES = 40 * 1024
"""More than the codec inlines: a tensor this large takes torch RPC's own path."""


def quietly(make: Any, *args: Any, **kwargs: Any) -> Any:
    """``make(*args, **kwargs)`` without the warnings torch gives for deprecated or experimental kinds.

    torch 2.13 warns on making quantized tensors (deprecated), complex32 ones
    (experimental) and compressed sparse ones (beta); the suite turns
    warnings into errors.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return make(*args, **kwargs)


def raw(data: bytes, dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
    """A tensor of ``dtype`` and ``shape`` holding exactly ``data`` (NaN payloads and all)."""
    if dtype == torch.bool:
        data = bytes(byte & 1 for byte in data)  # a bool is 0 or 1
    flat = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    return quietly(lambda: flat.view(dtype).reshape(shape).clone())


@st.composite
def dense(draw: st.DrawFn, *, large: bool | None = None) -> torch.Tensor:
    """A strided tensor: any dtype and shape, then a view or two, a conjugate or negative bit."""
    dtype = draw(st.sampled_from([*DTYPES, torch.complex64, torch.complex128]))  # conjugate bits more often
    if large is None:
        large = draw(st.integers(0, 9)) == 0
    if large:
        rows = draw(st.integers(1, 4))
        per_row = math.ceil(LARGE_BYTES / rows / dtype.itemsize)
        pattern = draw(st.binary(min_size=dtype.itemsize, max_size=8 * dtype.itemsize))
        count = rows * per_row * dtype.itemsize
        data = (pattern * (count // len(pattern) + 1))[: count - count % dtype.itemsize]
        tensor = raw(data, dtype, [rows, per_row])
    else:
        shape = draw(st.lists(st.integers(0, 4), max_size=3))
        nbytes = math.prod(shape) * dtype.itemsize
        tensor = raw(draw(st.binary(min_size=nbytes, max_size=nbytes)), dtype, shape)
    for _ in range(draw(st.integers(0, 2))):
        tensor = draw(views(tensor))
    if dtype in (torch.complex64, torch.complex128) and draw(st.booleans()):
        tensor = tensor.conj()  # the conjugate bit, not a copy
        if draw(st.booleans()):
            tensor = tensor.imag  # a real view with the negative bit
    elif dtype not in (torch.bool, torch.complex32) and dtype in INLINE_DTYPES and draw(st.booleans()):
        tensor = torch._neg_view(tensor)
    if dtype.is_floating_point and dtype in INLINE_DTYPES and draw(st.integers(0, 7)) == 0:
        tensor = tensor.detach().requires_grad_()  # torch RPC's path, which distributed autograd records
    return tensor


@st.composite
def views(draw: st.DrawFn, tensor: torch.Tensor) -> torch.Tensor:
    """A view of ``tensor`` that shares its memory: transposed, strided, narrowed, expanded or unsqueezed."""
    kinds = ["unsqueeze", "expand"]
    if tensor.dim() >= 2:
        kinds.append("transpose")
    if tensor.dim() >= 1:
        kinds += ["step", "narrow"]
    kind = draw(st.sampled_from(kinds))
    if kind == "unsqueeze":
        return tensor.unsqueeze(draw(st.integers(0, tensor.dim())))
    if kind == "expand":
        return tensor.unsqueeze(0).expand(draw(st.integers(0, 3)), *tensor.shape)  # stride 0
    if kind == "transpose":
        return tensor.transpose(0, tensor.dim() - 1)
    dim = draw(st.integers(0, tensor.dim() - 1))
    size = tensor.shape[dim]
    if kind == "step":
        return tensor[(slice(None),) * dim + (slice(None, None, draw(st.integers(2, 3))),)]
    start = draw(st.integers(0, size))
    return tensor.narrow(dim, start, draw(st.integers(0, size - start)))


@st.composite
def sparse(draw: st.DrawFn) -> torch.Tensor:
    """A sparse tensor of any layout that travels, from drawn values."""
    dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.int64, torch.complex64, torch.bool]))
    layout = draw(st.sampled_from(["coo", "uncoalesced", "hybrid", "csr", "csc", "bsr", "bsc"]))
    rows, cols = draw(st.integers(0, 3)) * 2, draw(st.integers(0, 3)) * 2
    values = draw(dense_of(dtype, [rows, cols]))
    mask = draw(dense_of(torch.bool, [rows, cols]))
    matrix = values * mask if dtype != torch.bool else values & mask  # some zeros
    if layout == "uncoalesced":
        nnz = draw(st.integers(0, 6)) if rows and cols else 0
        indices = draw(dense_of(torch.int64, [2, nnz]))
        indices = torch.stack([indices[0] % max(rows, 1), indices[1] % max(cols, 1)]) if nnz else indices
        values = draw(dense_of(dtype, [nnz]))
        return torch.sparse_coo_tensor(indices, values, (rows, cols), check_invariants=True)
    block = (2, 2) if rows and cols else (1, 1)
    make = {
        "coo": matrix.to_sparse,
        "hybrid": lambda: matrix.to_sparse(1),
        "csr": matrix.to_sparse_csr,
        "csc": matrix.to_sparse_csc,
        "bsr": lambda: matrix.to_sparse_bsr(block),
        "bsc": lambda: matrix.to_sparse_bsc(block),
    }
    return quietly(make[layout])  # compressed layouts warn that they are in beta


def dense_of(dtype: torch.dtype, shape: list[int]) -> st.SearchStrategy[torch.Tensor]:
    """A contiguous tensor of ``dtype`` and ``shape`` with drawn bits."""
    nbytes = math.prod(shape) * dtype.itemsize
    return st.binary(min_size=nbytes, max_size=nbytes).map(lambda data: raw(data, dtype, shape))


@st.composite
def quantized(draw: st.DrawFn) -> torch.Tensor:
    """A quantized tensor, per tensor or per channel, from drawn floats."""
    source = draw(dense_of(torch.float32, [draw(st.integers(1, 3)), draw(st.integers(0, 4))]))
    source = torch.nan_to_num(source, nan=0.0, posinf=1e3, neginf=-1e3).clamp(-1e3, 1e3)
    dtype = draw(st.sampled_from([torch.quint8, torch.qint8, torch.qint32]))
    if draw(st.booleans()):
        scale, zero = draw(st.floats(0.01, 10.0)), draw(st.integers(0, 10))
        return quietly(torch.quantize_per_tensor, source, scale, zero, dtype)
    scales = torch.tensor(draw(st.lists(st.floats(0.01, 10.0), min_size=len(source), max_size=len(source))))
    zeros = torch.tensor(draw(st.lists(st.integers(0, 10), min_size=len(source), max_size=len(source))))
    return quietly(torch.quantize_per_channel, source, scales.double(), zeros, 0, dtype)


@st.composite
def jagged(draw: st.DrawFn) -> torch.Tensor:
    """A nested tensor of jagged layout: rows of drawn lengths."""
    dtype = draw(st.sampled_from([torch.float32, torch.int64, torch.float64]))
    width = draw(st.integers(1, 3))
    rows = [draw(dense_of(dtype, [draw(st.integers(1, 4)), width])) for _ in range(draw(st.integers(1, 3)))]
    return torch.nested.nested_tensor(rows, layout=torch.jagged)


def tensors() -> st.SearchStrategy[torch.Tensor]:
    """Any tensor that travels between nodes."""
    return st.one_of(dense(), dense(), dense(), sparse(), quantized(), jagged())


def payloads() -> st.SearchStrategy[list[torch.Tensor]]:
    """What one message carries: one to three tensors, the same one twice at times."""
    return st.lists(tensors(), min_size=1, max_size=3).flatmap(
        lambda drawn: st.sampled_from([drawn, [*drawn, drawn[0]]])
    )


def _memory(tensor: torch.Tensor) -> bytes:
    """The bytes of a strided tensor's values, its conjugate and negative bits resolved, in logical order."""
    flat = tensor.detach().cpu().resolve_conj().resolve_neg().contiguous().reshape(-1)
    return ctypes.string_at(flat.data_ptr(), flat.nbytes) if flat.nbytes else b""


def bits(tensor: torch.Tensor) -> list[Any]:
    """Everything that makes ``tensor`` what it is, as plain data: two tensors are bitwise equal if these are."""
    if tensor.is_nested:
        return ["nested", str(tensor.layout), [bits(row) for row in tensor.unbind()]]
    layout = tensor.layout
    if layout == torch.sparse_coo:
        parts = [tensor.is_coalesced(), tensor._indices(), tensor._values()]
    elif layout in (torch.sparse_csr, torch.sparse_bsr):
        parts = [tensor.crow_indices(), tensor.col_indices(), tensor.values()]
    elif layout in (torch.sparse_csc, torch.sparse_bsc):
        parts = [tensor.ccol_indices(), tensor.row_indices(), tensor.values()]
    elif tensor.is_quantized:
        scheme = tensor.qscheme()
        if scheme == torch.per_tensor_affine:
            parts = [str(scheme), tensor.q_scale(), tensor.q_zero_point(), tensor.int_repr()]
        else:
            parts = [
                str(scheme),
                tensor.q_per_channel_scales(),
                tensor.q_per_channel_zero_points(),
                tensor.q_per_channel_axis(),
                tensor.int_repr(),
            ]
    else:
        return [str(tensor.dtype), list(tensor.shape), _memory(tensor)]
    described = [bits(part) if isinstance(part, torch.Tensor) else part for part in parts]
    return [str(layout), str(tensor.dtype), list(tensor.shape), *described]


class TensorEcho(actorch.Actor):
    """Says what arrived, bit for bit, and sends it back."""

    async def echo(self, tensors: list[torch.Tensor]) -> list[Any]:
        return [[bits(tensor) for tensor in tensors], tensors]
