"""Leases: tensors written straight into this process's shared-memory pool, sent on this host without a copy.

By default a tensor bound for a process of the same host is copied into a
segment of the sender's pool as it is sent, so that the sender may change its
own at once (``tell``'s promise). A :class:`Lease` skips that copy: the tensor
lives in a segment from the start, and sending it (or a view of it) lends the
segment as it is. The promise moves to the holder: write to the lease only
while :attr:`Lease.in_use` is false, when no receiver holds what was sent.
Off this host, or where the pool has no room, a lease is an ordinary tensor
and goes by value, as any other.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence

import torch

from actorch._base.channels.segments import Segment, SegmentPool
from actorch._base.constructors import NoPublicConstructor

__all__ = ["DEFAULT_SHM_POOL", "Lease", "lease", "process_pool"]

DEFAULT_SHM_POOL = 1 << 30
"""Bytes of shared memory a process's pool keeps at most, unless the system says otherwise (``shm_pool``)."""

_pool: SegmentPool | None = None


def process_pool() -> SegmentPool:
    """This process's pool of segments (one per process, as a node is): made at first use, with the default limit."""
    global _pool  # noqa: PLW0603 - one pool per process, its files named after the process
    if _pool is None or _pool.closed:
        _pool = SegmentPool(DEFAULT_SHM_POOL)
    return _pool


def use_pool_limit(limit: int) -> SegmentPool:
    """Set the byte limit of this process's pool (a node does, from ``shm_pool``); the pool."""
    pool = process_pool()
    pool.limit = limit
    return pool


class Lease(metaclass=NoPublicConstructor):
    """A tensor in this process's shared-memory pool (see the module's docstring); made by :func:`actorch.lease`.

    Use it as a context manager, or call :meth:`close`, to give its memory
    back; a lease that is garbage collected gives it back too.

    Attributes:
        tensor: The tensor to write into and send (contiguous, of the shape and dtype asked for).
        shared: Whether it lives in shared memory; False when the pool had no
            room (``/dev/shm`` full, or the pool at its ``shm_pool`` limit): it
            is then an ordinary tensor, sent by value.
        refusal: Why it is not in shared memory, when it is not.
    """

    __slots__ = ("_pool", "_segment", "refusal", "shared", "tensor")
    _made_by = "actorch.lease(shape, dtype)"

    def __init__(self, tensor: torch.Tensor, segment: Segment | None, pool: SegmentPool) -> None:
        self.tensor = tensor
        self.shared = segment is not None
        self.refusal: str | None = None
        self._segment = segment
        self._pool = pool

    def __repr__(self) -> str:
        where = self._segment.name if self._segment is not None else "private memory"
        return f"<actorch.Lease {tuple(self.tensor.shape)} {self.tensor.dtype} in {where} in_use={self.in_use}>"

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    @property
    def in_use(self) -> bool:
        """Whether a receiver still holds what was sent from it: write to the tensor only when this is false."""
        segment = self._segment
        return segment is not None and segment.busy()

    async def wait_free(self, poll: float = 0.001) -> None:
        """Wait until no receiver holds what was sent from the lease (looking every ``poll`` seconds).

        Receivers let go when their last tensor over it is freed; bound the wait
        with the caller's deadline (``asyncio.timeout``) where a receiver may keep it.
        """
        while self.in_use:  # noqa: ASYNC110 - receivers write into shared memory: no event can tell this process
            await asyncio.sleep(poll)

    def close(self) -> None:
        """Give the memory back to the pool (once receivers let go of it); the tensor must not be used after."""
        segment, self._segment = self._segment, None
        if segment is not None:
            self._pool.end_lease(segment)


def lease(shape: Sequence[int] | int, dtype: torch.dtype = torch.float32) -> Lease:
    """A tensor of ``shape`` and ``dtype`` in this process's shared-memory pool, sent on this host without a copy.

    Its contents are whatever the memory held: write them before sending.

    Raises:
        ValueError: ``shape`` is not a sequence of sizes >= 0, or ``dtype`` not a torch dtype.
    """
    sizes = (shape,) if isinstance(shape, int) else tuple(shape)
    if not all(isinstance(size, int) and not isinstance(size, bool) and size >= 0 for size in sizes):
        raise ValueError(f"lease() takes a shape of sizes >= 0, not {shape!r}")
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"lease() takes a torch dtype, not {dtype!r}")
    nbytes = math.prod(sizes) * dtype.itemsize
    pool = process_pool()
    segment = pool.lease(nbytes) if nbytes else None
    if segment is None:
        private = Lease._create(torch.empty(sizes, dtype=dtype), None, pool)
        if not nbytes:
            private.refusal = "it holds no bytes"
        elif pool.refused and pool.refusal is not None:
            private.refusal = pool.refusal
        else:
            private.refusal = f"this process's pool of shared memory is at its limit ({pool.limit:,} bytes, shm_pool)"
        return private
    assert segment.data is not None
    tensor = segment.data[:nbytes].view(dtype).view(sizes)
    return Lease._create(tensor, segment, pool)
