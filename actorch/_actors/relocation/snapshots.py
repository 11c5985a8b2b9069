"""``SnapshotStore``: the snapshots of named relocatable actors in a directory, where they outlive rank 0.

With ``run(snapshots=DIR)``, rank 0's relocator writes every snapshot a named
relocatable actor saves into ``DIR`` before ``save_snapshot`` returns, and a
system started again with the same directory finds each actor's last one by
its name. Only rank 0 reads and writes the directory.

Layout: a folder per actor name (``/`` written as ``+``, which no name holds),
a numbered file per snapshot: ``DIR/rl+learner/000000000012.snapshot``. A file
is a tensor file (``_base/tensorfile``): the state's codec bytes ride as a
``uint8`` tensor beside the state's own tensors, so that its checksum covers
all of it, and the header names the actor and the number. A file is written to
a temporary name, flushed, synced and renamed, the folder synced after it;
then all but the newest ``kept`` are removed. Reading starts from the newest:
a file that fails its checks (torn, corrupt, another actor's) is passed over
with a warning naming the actor and the file, and the one before it is used.
"""

from __future__ import annotations

import asyncio
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from actorch._base.codec import Codec
from actorch._base.errors import SerializationError, SnapshotError, describe
from actorch._base.tensorfile import load_tensors, save_tensors

__all__ = ["SnapshotFile", "SnapshotStore", "folder_name"]

FORMAT = "actorch.snapshot"
FORMAT_VERSION = 1
_SUFFIX = ".snapshot"
_FILE = re.compile(r"(\d+)\.snapshot")
_BODY = "state"  # the tensor that holds the state's codec bytes; its own tensors are "0", "1", ...


def folder_name(name: str) -> str:
    """The folder of actor ``name``'s snapshots: its name with ``/`` written as ``+`` (names hold no ``+``)."""
    return name.replace("/", "+")


@dataclass(frozen=True)
class SnapshotFile:
    """One snapshot file of one actor.

    Attributes:
        actor: The actor's name.
        serial: Its number: each snapshot of the actor gets the next one, across runs.
        path: The file.
        saved: When it was written (seconds since the epoch, the file's modification time).
    """

    actor: str
    serial: int
    path: str
    saved: float


class SnapshotStore:
    """A directory of snapshots, the last ``kept`` of each named actor, written by rank 0's relocator."""

    def __init__(self, directory: str, kept: int, codec: Codec, log: Any) -> None:
        """Use ``directory`` (made if missing) with ``codec`` for the states; warnings go to ``log``.

        Raises:
            OSError: The directory cannot be made, or is not a directory.
        """
        self.directory = Path(directory)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise type(exc)(exc.errno, f"cannot use the snapshot directory {directory!r}: {exc.strerror}") from exc
        self.kept = kept
        self._codec = codec
        self._log = log
        self._serials: dict[str, int] = {}  # the last number given to each actor's snapshots
        self._locks: dict[str, asyncio.Lock] = {}  # one actor's writes, one at a time, in order
        self.written = 0

    def __repr__(self) -> str:
        return f"<SnapshotStore {str(self.directory)!r} kept={self.kept}>"

    def files(self, name: str) -> list[SnapshotFile]:
        """Actor ``name``'s snapshot files, the newest first (a blocking listing: call it off the loop)."""
        folder = self.directory / folder_name(name)
        found = []
        try:
            entries = list(os.scandir(folder))
        except FileNotFoundError:
            return []
        for entry in entries:
            match = _FILE.fullmatch(entry.name)
            if match is None:
                continue
            try:
                saved = entry.stat().st_mtime
            except FileNotFoundError:  # removed meanwhile
                continue
            found.append(SnapshotFile(name, int(match[1]), entry.path, saved))
        return sorted(found, key=lambda file: file.serial, reverse=True)

    async def save(self, name: str, state: Any) -> SnapshotFile:
        """Write ``state`` as actor ``name``'s newest snapshot, on disk and synced when this returns.

        The state is encoded here, on the loop; the file is written in a
        thread. The state's tensors must not change until this returns.

        Raises:
            SerializationError: ``state`` holds something the codec cannot encode, or that a file cannot hold.
            OSError: The file cannot be written (the directory's file system is full, gone, read-only).
        """
        body, side = self._codec.encode(state)
        tensors: dict[str, torch.Tensor] = {_BODY: torch.frombuffer(bytearray(body), dtype=torch.uint8)}
        for index, tensor in enumerate(side):
            if not isinstance(tensor, torch.Tensor):
                raise SerializationError(
                    f"the snapshot of actor {name!r} holds a {type(tensor).__qualname__}, which a file cannot keep"
                )
            tensors[str(index)] = tensor
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            return await asyncio.to_thread(self._write, name, tensors)

    async def load(self, name: str, context: Any) -> tuple[Any] | None:
        """Actor ``name``'s last readable snapshot, as ``(state,)``; None if it has none.

        A newer file that fails its checks is passed over with a warning that
        names the actor and the file. ``context`` decodes the refs in the
        state (the node's caller).
        """
        files = await asyncio.to_thread(self.files, name)
        for file in files:
            try:
                tensors, meta = await asyncio.to_thread(load_tensors, file.path)
                state = self._decode(file, tensors, meta, context)
            except (SnapshotError, SerializationError, OSError) as exc:
                self._log.warning(
                    "snapshot file unreadable; the one before it is used",
                    actor=name,
                    file=file.path,
                    error=describe(exc),
                )
                continue
            return (state,)
        if files:
            self._log.warning("no snapshot file of the actor is readable; it starts fresh", actor=name)
        return None

    async def latest(self, name: str) -> SnapshotFile | None:
        """Actor ``name``'s newest snapshot file, unread; None if it has none."""
        files = await asyncio.to_thread(self.files, name)
        return files[0] if files else None

    # ------------------------------------------------------------------ in a thread

    def _write(self, name: str, tensors: dict[str, torch.Tensor]) -> SnapshotFile:
        folder = self.directory / folder_name(name)
        folder.mkdir(exist_ok=True)
        serial = self._serials.get(name)
        if serial is None:  # the first save of this run: after what earlier runs wrote
            serial = max((file.serial for file in self.files(name)), default=0)
        serial += 1
        path = folder / f"{serial:012d}{_SUFFIX}"
        meta = {"format": FORMAT, "format_version": FORMAT_VERSION, "actor": name, "serial": serial}
        save_tensors(path, tensors, meta)
        self._serials[name] = serial
        _sync_folder(folder)
        self.written += 1
        self._prune(name, folder)
        return SnapshotFile(name, serial, str(path), path.stat().st_mtime)

    def _prune(self, name: str, folder: Path) -> None:
        """Remove all but the newest ``kept`` files of actor ``name``, and temporary files left by a crash."""
        for file in self.files(name)[self.kept :]:
            Path(file.path).unlink(missing_ok=True)
        for leftover in folder.glob(f".*{_SUFFIX}.*.tmp"):  # this actor's writes are done: none is under way
            leftover.unlink(missing_ok=True)

    def _decode(self, file: SnapshotFile, tensors: dict[str, torch.Tensor], meta: Any, context: Any) -> Any:
        where = repr(file.path)
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise SnapshotError(f"{where} is a tensor file but not an actor snapshot")
        if meta.get("format_version") != FORMAT_VERSION:
            raise SnapshotError(f"{where} has format version {meta.get('format_version')!r}, not {FORMAT_VERSION}")
        if meta.get("actor") != file.actor or meta.get("serial") != file.serial:
            raise SnapshotError(
                f"{where} holds snapshot {meta.get('serial')!r} of actor {meta.get('actor')!r}, "
                f"not snapshot {file.serial} of {file.actor!r}"
            )
        body = tensors.pop(_BODY, None)
        if body is None or body.dtype != torch.uint8 or body.dim() != 1:
            raise SnapshotError(f"{where} holds no state")
        if sorted(tensors) != sorted(map(str, range(len(tensors)))):
            raise SnapshotError(f"{where} holds tensors the state does not name: {sorted(tensors)}")
        side = [tensors[str(index)] for index in range(len(tensors))]
        return self._codec.decode(body.numpy().tobytes(), side, context)


def _sync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable: sync the folder itself (where the file system allows)."""
    try:
        handle = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:  # some file systems cannot sync a directory; the rename stands all the same
        pass
    finally:
        os.close(handle)
