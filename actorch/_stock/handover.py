"""Handing a collector's batches to a learner on the same host by reference: slots of shared memory, not messages.

A batch of pixels is megabytes. Sent as tensors it is copied on its way (the
stream keeps a private copy for its sender, the transport copies it into the
receiver) and costs both ends a millisecond of CPU per megabyte. When the
learner shares the collector's host (and its ``/dev/shm``), the collector
writes each batch's observations straight into a slot of shared memory, one
of a few it reuses round robin, and the batch carries the slot's name; the
learner maps the slot (once: the mapping is kept) and copies the observations
out, the one copy on their way. A slot is written again only once the learner has
taken the batch that used it: the collector is told how many batches its
reader may hold unread (a stream's window), and keeps one slot more.

The slots are torch's shared memory by file name: the file goes when every
process that mapped it has let it go, and torch's shared-memory manager
removes it if they die first.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import tempfile
from collections import OrderedDict
from typing import Any, NamedTuple

import torch

from actorch._stock.batch import Batch

__all__ = ["Handover", "Mappings", "Slots", "by_reference", "host_identity", "usable"]

_ALIGN = 64
_MAPPINGS = 64
"""Slots a reader keeps mapped (most recently used): a few per collector it reads."""


class Handover(NamedTuple):
    """What a reader asks of a collector so that batches come by reference: who it is, and how many it may hold.

    Attributes:
        host: The reader's :func:`host_identity`; a collector on another host sends batches by value.
        pid: The reader's process: a collector in the same process hands over its batches as they are.
        slots: How many slots the collector keeps (the batches the reader may hold unread, plus one).
    """

    host: str
    pid: int
    slots: int


@functools.cache
def host_identity() -> str:
    """What two processes share when they share shared memory: the boot, ``/dev/shm`` and the temporary folder.

    Processes in containers with namespaces of their own differ here even on one machine.
    """
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot:
            boot_id = boot.read().strip()
        shm = os.stat("/dev/shm")  # noqa: S108 - its identity is read, nothing is written there
    except OSError:
        return f"no-shm:{os.getpid()}"  # no shared memory by name here: never equal to another process's
    temporary = os.stat(tempfile.gettempdir())  # torch's shared-memory manager listens there
    return f"{boot_id}:{shm.st_dev}:{shm.st_ino}:{temporary.st_dev}:{temporary.st_ino}"


def usable(handover: Any) -> Handover | None:
    """``handover`` as sent by a reader, if batches can go to it by reference from this process."""
    if handover is None:
        return None
    asked = Handover(*handover)
    if asked.host != host_identity() or asked.pid == os.getpid() or asked.slots < 1:
        return None
    return asked


class Slots:
    """A collector's slots of shared memory, taken round robin; one grows when a batch needs more room."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._storages: list[torch.UntypedStorage | None] = [None] * count
        self._next = 0

    def __repr__(self) -> str:
        made = sum(storage is not None for storage in self._storages)
        return f"<Slots {made} of {self.count} made>"

    def take(self, nbytes: int) -> torch.UntypedStorage:
        """The next slot, with room for ``nbytes``."""
        index = self._next
        self._next = (index + 1) % self.count
        storage = self._storages[index]
        if storage is None or storage.nbytes() < nbytes:
            storage = torch.UntypedStorage._new_using_filename_cpu(nbytes)
            self._storages[index] = storage
        return storage


def carve(storage: torch.UntypedStorage, shape: tuple[int, ...], dtype: torch.dtype, count: int) -> list[torch.Tensor]:
    """``count`` contiguous tensors of ``shape`` and ``dtype`` laid one after the other in ``storage``."""
    tensors = []
    offset = 0
    size = _aligned(torch.Size(shape).numel() * dtype.itemsize)
    for _ in range(count):
        tensors.append(view(storage, offset, shape, dtype))
        offset += size
    return tensors


def room(shape: tuple[int, ...], dtype: torch.dtype, count: int) -> int:
    """Bytes that :func:`carve` needs for ``count`` tensors."""
    return _aligned(torch.Size(shape).numel() * dtype.itemsize) * count


def view(
    storage: torch.UntypedStorage, offset: int, shape: tuple[int, ...] | list[int], dtype: torch.dtype
) -> torch.Tensor:
    """The contiguous tensor of ``shape`` and ``dtype`` at byte ``offset`` of ``storage``."""
    strides = [1] * len(shape)
    for axis in range(len(shape) - 2, -1, -1):
        strides[axis] = strides[axis + 1] * shape[axis + 1]
    return torch.empty(0, dtype=dtype).set_(storage, offset // dtype.itemsize, tuple(shape), strides)


def describe(tensor: torch.Tensor) -> list[Any]:
    """Where ``tensor`` lies in its storage, for :func:`view` on the other side: byte offset, shape, dtype."""
    return [
        tensor.storage_offset() * tensor.element_size(),
        list(tensor.shape),
        str(tensor.dtype).removeprefix("torch."),
    ]


def name(storage: torch.UntypedStorage) -> list[Any]:
    """The slot's name as another process maps it: its manager, its file and its size."""
    manager, filename, size = storage._share_filename_cpu_()
    return [manager, filename, size]


class Mappings:
    """The slots a reader has mapped, by file name: each mapped once and kept, the most recently used few.

    Dropping them (:meth:`clear`, or the reader itself) lets the collectors' files go.
    """

    def __init__(self, keep: int = _MAPPINGS) -> None:
        self.keep = keep
        self._storages: OrderedDict[bytes, torch.UntypedStorage] = OrderedDict()

    def __repr__(self) -> str:
        return f"<Mappings {len(self._storages)} of at most {self.keep}>"

    def __len__(self) -> int:
        return len(self._storages)

    def resolved(self, batch: Batch) -> Batch:
        """``batch`` with the observations it names copied out of their slot: the one copy on their way."""
        if batch.slot is None:
            return batch
        *slot, observations, following = batch.slot
        storage = self._mapped(slot)
        return dataclasses.replace(
            batch, observations=_copy(storage, observations), next_observations=_copy(storage, following), slot=None
        )

    def clear(self) -> None:
        """Let every slot go."""
        self._storages.clear()

    def _mapped(self, slot: list[Any]) -> torch.UntypedStorage:
        manager, filename, size = slot
        storage = self._storages.get(filename)
        if storage is None or storage.nbytes() != size:
            storage = torch.UntypedStorage._new_shared_filename_cpu(manager, filename, size)
            self._storages[filename] = storage
            while len(self._storages) > self.keep:
                self._storages.popitem(last=False)
        else:
            self._storages.move_to_end(filename)
        return storage


def by_reference(batch: Batch, storage: torch.UntypedStorage) -> Batch:
    """``batch`` to send with its observations left in the slot ``storage``, which the batch names instead."""
    where = [describe(batch.observations), describe(batch.next_observations)]
    empty = batch.observations.new_empty((0,))
    return dataclasses.replace(batch, observations=empty, next_observations=empty, slot=[*name(storage), *where])


def _copy(storage: torch.UntypedStorage, where: list[Any]) -> torch.Tensor:
    offset, shape, dtype = where
    return view(storage, offset, shape, getattr(torch, dtype)).clone()


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN
