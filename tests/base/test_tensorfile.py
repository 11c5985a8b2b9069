"""save_tensors / load_tensors: round trips of every dtype and shape, and refusal of damaged files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import actorch
from actorch import SnapshotError, load_tensors, save_tensors

TENSORS = {
    "float": torch.randn(3, 4, generator=torch.Generator().manual_seed(0)),
    "long": torch.arange(10),
    "empty": torch.zeros(0, 5),
    "scalar": torch.tensor(3.5, dtype=torch.bfloat16),
    "bool": torch.tensor([[True, False], [False, True]]),
    "strided": torch.arange(12.0).reshape(3, 4).t(),
}


def test_save_tensors_round_trips_dtypes_shapes_and_meta(tmp_path: Path) -> None:
    path = tmp_path / "t.bin"
    written = save_tensors(path, TENSORS, {"step": 3, "names": ["a", "b"], "blob": b"\x00"})
    assert written == path.stat().st_size
    loaded, meta = load_tensors(path)
    assert meta == {"step": 3, "names": ["a", "b"], "blob": b"\x00"}
    assert loaded.keys() == TENSORS.keys()
    for name, tensor in TENSORS.items():
        assert loaded[name].dtype == tensor.dtype
        assert torch.equal(loaded[name], tensor)


def test_save_tensors_with_no_tensors_round_trips(tmp_path: Path) -> None:
    save_tensors(tmp_path / "t.bin", {}, None)
    assert load_tensors(tmp_path / "t.bin") == ({}, None)


def test_save_tensors_replaces_the_file_whole_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "t.bin"
    save_tensors(path, {"a": torch.ones(1000)})
    save_tensors(path, {"b": torch.zeros(2)})
    assert list(load_tensors(path)[0]) == ["b"]
    assert [p.name for p in tmp_path.iterdir()] == ["t.bin"]


def test_save_tensors_refuses_a_value_that_is_not_a_tensor(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="'x' is a list"):
        save_tensors(tmp_path / "t.bin", {"x": [1, 2]})  # type: ignore[dict-item]
    assert not list(tmp_path.iterdir())


def test_save_tensors_refuses_meta_that_needs_pickle(tmp_path: Path) -> None:
    with pytest.raises(actorch.SerializationError):
        save_tensors(tmp_path / "t.bin", {}, {"s": {1, 2}})
    assert not list(tmp_path.iterdir())


def damaged(tmp_path: Path, how: str) -> Path:
    path = tmp_path / "t.bin"
    save_tensors(path, TENSORS, {"k": 1})
    data = bytearray(path.read_bytes())
    if how == "truncated":
        data = data[:-7]
    elif how == "trailing":
        data += b"\x00"
    elif how == "data byte":
        data[-1] ^= 0xFF
    elif how == "magic":
        data[0] ^= 0xFF
    elif how == "header length":
        data[16:24] = (len(data) * 2).to_bytes(8, "little")
    elif how == "header byte":
        data[30] ^= 0xFF
    elif how == "only magic":
        data = data[:16]
    elif how == "empty":
        data = bytearray()
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize(
    "how", ["truncated", "trailing", "data byte", "magic", "header length", "header byte", "only magic", "empty"]
)
def test_load_tensors_refuses_a_damaged_file(tmp_path: Path, how: str) -> None:
    with pytest.raises(SnapshotError, match=r"t\.bin"):
        load_tensors(damaged(tmp_path, how))


def test_load_tensors_error_is_a_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not an actorch tensor file"):
        load_tensors(damaged(tmp_path, "magic"))


def test_load_tensors_of_a_missing_file_raises_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_tensors(tmp_path / "missing.bin")


def test_save_tensors_from_two_threads_to_one_path_never_mixes_files(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

    path = tmp_path / "t.bin"
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: save_tensors(path, {"a": torch.full((100_000,), float(i))}, i), range(16)))
    loaded, meta = load_tensors(path)
    assert torch.equal(loaded["a"], torch.full((100_000,), float(meta)))
    assert [p.name for p in tmp_path.iterdir()] == ["t.bin"]
