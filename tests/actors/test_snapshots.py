"""Durable snapshots: ``SnapshotStore`` and what a system with ``snapshots=DIR`` does with it.

The store alone (numbered files, the last K kept, a torn or corrupt file passed
over), then in-process worlds: a named relocatable actor that saves writes its
snapshots there, and a world started again with the same directory starts it
from the last one, before its ``on_start``. Killing rank 0 of a real job is in
``test_snapshots_multiprocess``.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
import structlog
import torch
from actors import Tally

import actorch
from actorch._actors.relocation.relocator import Relocator
from actorch._actors.relocation.snapshots import SnapshotStore, folder_name
from actorch._base.codec import Codec
from actorch._engine.system_ids import RELOCATOR_ID
from actorch.testing import LocalWorld, local_world

RELOCATE = actorch.Restart(relocate=True, backoff=0.0)


def store_in(directory: Path, kept: int = 2, *, strict: bool = False) -> SnapshotStore:
    return SnapshotStore(str(directory), kept, Codec(strict=strict), structlog.get_logger("actorch"))


def relocator(world: LocalWorld) -> Relocator:
    cell = world[0].host.node.cell(RELOCATOR_ID)
    assert cell is not None
    assert isinstance(cell.instance, Relocator)
    return cell.instance


def damage(path: str, how: str, other: str | None = None) -> None:
    """Damage a snapshot file as a crash, a bad disk or a misplaced copy would."""
    file = Path(path)
    data = file.read_bytes()
    if how == "truncated":
        file.write_bytes(data[: len(data) // 2])
    elif how == "flipped":
        file.write_bytes(data[:-100] + bytes([data[-100] ^ 0x01]) + data[-99:])
    elif how == "garbage":
        file.write_bytes(b"\0" * 64)
    else:
        assert other is not None
        file.write_bytes(Path(other).read_bytes())


def warnings_of(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [entry for entry in logs if entry["log_level"] == "warning"]


class Ordered(actorch.Actor):
    """A relocatable count that notes the order its hooks ran in."""

    def __init__(self, start: int = 0) -> None:
        self.count = start
        self.hooks: list[str] = []

    def restore(self, state: dict[str, Any]) -> None:
        self.hooks.append(f"restore {state['count']}")
        self.count = state["count"]

    async def on_start(self) -> None:
        self.hooks.append(f"on_start {self.count}")

    async def add(self, k: int = 1) -> int:
        self.count += k
        await self.save_snapshot({"count": self.count, "weights": torch.full((3,), float(self.count))})
        return self.count

    async def seen(self) -> list[str]:
        return self.hooks


# ---------------------------------------------------------------------- the store


async def test_each_save_is_the_next_numbered_file_and_only_the_last_k_stay(tmp_path: Path) -> None:
    store = store_in(tmp_path, kept=2)
    for count in range(5):
        written = await store.save("rl/learner", {"count": count, "t": torch.arange(count + 1)})
        assert written.serial == count + 1
        assert written.path == str(tmp_path / "rl+learner" / f"{count + 1:012d}.snapshot")
    folder = tmp_path / "rl+learner"
    assert sorted(os.listdir(folder)) == ["000000000004.snapshot", "000000000005.snapshot"]
    assert [file.serial for file in store.files("rl/learner")] == [5, 4]
    (state,) = await store.load("rl/learner", None) or ()
    assert state["count"] == 4
    assert torch.equal(state["t"], torch.arange(5))
    assert store.written == 5


async def test_numbers_go_on_from_what_an_earlier_store_wrote_and_leftover_temporary_files_go(tmp_path: Path) -> None:
    await store_in(tmp_path).save("a", 1)
    await store_in(tmp_path).save("a", 2)
    leftover = tmp_path / "a" / ".000000000003.snapshot.abc123.tmp"  # what a crash while writing leaves
    leftover.write_bytes(b"half a file")
    latest = await store_in(tmp_path).save("a", 3)
    assert latest.serial == 3
    assert not leftover.exists()
    assert (await store_in(tmp_path).latest("a")) == store_in(tmp_path).files("a")[0]


def test_names_map_to_one_folder_each() -> None:
    assert folder_name("rl/observers/3") == "rl+observers+3"
    assert folder_name("learner") == "learner"


async def test_an_actor_without_snapshots_has_none(tmp_path: Path) -> None:
    store = store_in(tmp_path)
    assert await store.load("nobody", None) is None
    assert await store.latest("nobody") is None


@pytest.mark.parametrize("how", ["truncated", "flipped", "garbage", "another actor's"])
async def test_a_torn_or_corrupt_newest_file_is_passed_over_with_a_warning_naming_actor_and_file(
    tmp_path: Path, how: str
) -> None:
    store = store_in(tmp_path, kept=3)
    await store.save("learner", {"step": 1, "w": torch.ones(1000)})
    newest = await store.save("learner", {"step": 2, "w": torch.ones(1000) * 2})
    other = await store.save("observer", {"step": 9})
    damage(newest.path, how, other.path)
    with structlog.testing.capture_logs() as logs:
        (state,) = await store.load("learner", None) or ()
    assert state["step"] == 1, "the snapshot before the damaged one"
    (warning,) = warnings_of(logs)
    assert warning["event"] == "snapshot file unreadable; the one before it is used"
    assert warning["actor"] == "learner"
    assert warning["file"] == newest.path


async def test_when_no_file_is_readable_the_actor_starts_fresh_with_a_warning(tmp_path: Path) -> None:
    store = store_in(tmp_path)
    written = await store.save("learner", 1)
    damage(written.path, "garbage")
    with structlog.testing.capture_logs() as logs:
        assert await store.load("learner", None) is None
    assert [entry["event"] for entry in warnings_of(logs)] == [
        "snapshot file unreadable; the one before it is used",
        "no snapshot file of the actor is readable; it starts fresh",
    ]


async def test_a_state_the_codec_refuses_is_not_written(tmp_path: Path) -> None:
    store = store_in(tmp_path, strict=True)
    with pytest.raises(actorch.SerializationError, match="strict serialization refuses set values"):
        await store.save("learner", {1, 2})
    assert store.files("learner") == []


def test_a_directory_that_cannot_be_made_is_refused_naming_it(tmp_path: Path) -> None:
    taken = tmp_path / "a-file"
    taken.write_text("")
    with pytest.raises(OSError, match=r"cannot use the snapshot directory .*a-file"):
        store_in(taken)


async def test_a_file_that_cannot_be_written_raises_oserror(tmp_path: Path) -> None:
    store = store_in(tmp_path)
    (tmp_path / "learner").write_text("a file where the actor's folder goes")
    with pytest.raises(FileExistsError, match="learner"):
        await store.save("learner", 1)


# ---------------------------------------------------------------------- a system with a snapshot directory


async def test_a_named_relocatable_actor_resumes_in_a_new_system_restore_before_on_start(tmp_path: Path) -> None:
    async with local_world(3, snapshots=str(tmp_path)) as world:
        ordered = await world[0].spawn(Ordered, name="counts/a", on=1, restart=RELOCATE)
        for _ in range(3):
            await ordered.call(Ordered.add, 2)
        assert relocator(world).statistics()["written"] == 3
    assert sorted(os.listdir(tmp_path / "counts+a")) == ["000000000002.snapshot", "000000000003.snapshot"]
    async with local_world(3, snapshots=str(tmp_path)) as world:
        again = await world[0].spawn(Ordered, args=(100,), name="counts/a", on=2, restart=RELOCATE)
        assert await again.call(Ordered.seen) == ["restore 6", "on_start 6"]
        assert await again.call(Ordered.add) == 7
    assert store_in(tmp_path).files("counts/a")[0].serial == 4, "numbers go on across systems"


async def test_an_actor_resumed_then_relocated_before_saving_again_keeps_the_directorys_state(tmp_path: Path) -> None:
    async with local_world(3, snapshots=str(tmp_path)) as world:
        tally = await world[0].spawn(Tally, args=(5,), name="tally", on=1, restart=RELOCATE)
        for _ in range(7):
            await tally.call(Tally.add)
    async with local_world(3, snapshots=str(tmp_path)) as world:
        tally = await world[0].spawn(Tally, args=(5,), name="tally", on=1, restart=RELOCATE)
        assert await tally.call(Tally.get) == 5
        world.kill(1)
        assert await tally.call(Tally.get) == 5
        assert tally.rank == 2


async def test_unnamed_and_plain_actors_write_nothing_and_a_new_directory_is_a_fresh_start(tmp_path: Path) -> None:
    async with local_world(3, snapshots=str(tmp_path / "first")) as world:
        unnamed = await world[0].spawn(Tally, args=(1,), on=1, restart=RELOCATE)
        await unnamed.call(Tally.add)
        plain = await world[0].spawn(Tally, args=(1,), name="plain", on=1)
        await plain.call(Tally.add)  # save_snapshot returns False: not relocatable
        named = await world[0].spawn(Tally, args=(1,), name="named", on=2, restart=RELOCATE)
        await named.call(Tally.add, 3)
        assert relocator(world).statistics()["snapshots"] == 2
    assert os.listdir(tmp_path / "first") == ["named"]
    async with local_world(3, snapshots=str(tmp_path / "second")) as world:
        named = await world[0].spawn(Tally, args=(1,), name="named", on=2, restart=RELOCATE)
        assert await named.call(Tally.get) == 0


async def test_without_a_directory_nothing_outlives_the_system(tmp_path: Path) -> None:
    async with local_world(3) as world:
        named = await world[0].spawn(Tally, args=(1,), name="named", on=2, restart=RELOCATE)
        await named.call(Tally.add, 3)
        assert relocator(world).statistics()["written"] == 0
    async with local_world(3) as world:
        named = await world[0].spawn(Tally, args=(1,), name="named", on=2, restart=RELOCATE)
        assert await named.call(Tally.get) == 0


async def test_a_snapshot_that_cannot_be_written_fails_save_snapshot_and_one_unreadable_fails_the_spawn(
    tmp_path: Path,
) -> None:
    async with local_world(3, snapshots=str(tmp_path)) as world:
        tally = await world[0].spawn(Tally, args=(1,), name="blocked", on=1, restart=RELOCATE)
        (tmp_path / "blocked").write_text("a file where the actor's folder goes")
        with pytest.raises(actorch.RemoteError) as failed:
            await tally.call(Tally.add)
        assert isinstance(failed.value, OSError)
        assert relocator(world).statistics()["snapshots"] == 1, "kept in rank 0's memory all the same"
        await tally.stop()
        with pytest.raises(NotADirectoryError, match="blocked"):
            await world[0].spawn(Tally, name="blocked", on=2, restart=RELOCATE)


# ---------------------------------------------------------------------- restore= wins over the directory


async def replay_with(world: LocalWorld, **kwargs: Any) -> actorch.ActorRef[actorch.ReplayBuffer]:
    return await world[0].spawn(actorch.ReplayBuffer, args=(100,), kwargs=kwargs, name="replay", on=1, restart=RELOCATE)


async def test_an_explicit_restore_wins_over_a_newer_snapshot_in_the_directory_with_a_warning(tmp_path: Path) -> None:
    snapshots, file = tmp_path / "dir", tmp_path / "replay.snap"
    async with local_world(3, snapshots=str(snapshots)) as world:
        buffer = await replay_with(world, snapshot_every=5)
        await buffer.call(actorch.ReplayBuffer.extend, {"x": torch.arange(5.0)})
        await buffer.call(actorch.ReplayBuffer.snapshot, str(file))
        os.utime(file, (1.0, 1.0))  # written long before what the directory holds
        await buffer.call(actorch.ReplayBuffer.extend, {"x": torch.arange(5.0)})  # the directory holds 10
    async with local_world(3, snapshots=str(snapshots)) as world:
        with structlog.testing.capture_logs() as logs:
            buffer = await replay_with(world, restore=str(file))
        assert (await buffer.call(actorch.ReplayBuffer.statistics))["size"] == 5, "the file, not the directory"
    (warning,) = warnings_of(logs)
    assert warning["event"].startswith("restore= given: the actor starts from it, not from the newer snapshot")
    assert warning["actor"] == "replay"
    assert warning["restore"] == str(file)
    assert warning["newer"].endswith("replay/000000000002.snapshot")
    os.utime(file)  # now newer than the directory's: nothing to warn about
    async with local_world(3, snapshots=str(snapshots)) as world:
        with structlog.testing.capture_logs() as logs:
            buffer = await replay_with(world, restore=str(file))
        assert (await buffer.call(actorch.ReplayBuffer.statistics))["size"] == 5
    assert warnings_of(logs) == []


async def test_without_restore_the_replay_buffer_resumes_from_the_directory(tmp_path: Path) -> None:
    async with local_world(3, snapshots=str(tmp_path)) as world:
        buffer = await replay_with(world, snapshot_every=4)
        for start in range(0, 10, 2):
            await buffer.call(actorch.ReplayBuffer.extend, {"x": torch.arange(start, start + 2.0)})
    async with local_world(3, snapshots=str(tmp_path)) as world:
        buffer = await replay_with(world, snapshot_every=4)
        held = await buffer.call(actorch.ReplayBuffer.statistics)
        assert held["size"] == 8, "saved at 4 and 8 transitions; the last 2 came after"
        sample = await buffer.call(actorch.ReplayBuffer.sample, 64)
        assert set(sample.data["x"].tolist()) == set(map(float, range(8)))


async def test_the_system_refuses_a_snapshot_directory_it_cannot_make(tmp_path: Path) -> None:
    taken = tmp_path / "a-file"
    taken.write_text("")
    with pytest.raises(OSError, match="cannot use the snapshot directory"):
        async with local_world(2, snapshots=str(taken)):
            pass
    await asyncio.sleep(0)
