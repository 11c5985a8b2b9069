"""Shared fixtures: a three-node in-process world and the rank a test's actor lives on.

The tests sit in one folder per layer (``tests/README.md``); this file, ``_mp``
and ``netns`` serve them all, importable from every folder because pytest puts
this folder on ``sys.path``. The shared test actors live in
``tests/mp_scripts/actors.py``, imported as ``actors``: the multi-process
scripts import it so (their folder comes first on their ``sys.path``), and so
do the tests, from the same folder put on ``sys.path`` below. One module under
one name in every process means one import path per class, ``actors:Counter``,
which every node can resolve.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import torch
from _mp import SCRIPTS

from actorch.testing import LocalWorld, local_world, new_event_loop

if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``cuda`` skip, with the reason, where this machine has no CUDA GPU."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: torch.cuda.is_available() is False on this machine")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, Callable[[], Any]]:
    """The tests' loops are the one ``actorch.run`` makes (other loops are tested where a test says so)."""
    return {"deadline-loop": new_event_loop}


@pytest.fixture(scope="session", autouse=True)
def private_runtime_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The systems the suite runs announce and record themselves in directories of their own, not the user's.

    The scripts it starts inherit it, so ``actorch status`` and ``actorch stop``
    in a test see only the suite's systems.
    """
    private = {
        "ACTORCH_RUNTIME_DIR": str(tmp_path_factory.mktemp("runtime")),
        "ACTORCH_RUNS_DIR": str(tmp_path_factory.mktemp("runs")),  # and their run records, likewise
    }
    saved = {name: os.environ.get(name) for name in private}
    os.environ.update(private)
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture
async def world() -> AsyncIterator[LocalWorld]:
    """Three nodes in this event loop; tests call from rank 0 unless they say otherwise."""
    async with local_world(3, stop_grace=0.5) as running:
        yield running


@pytest.fixture(params=[0, 1], ids=["same node", "other node"])
def on(request: pytest.FixtureRequest) -> int:
    """Rank hosting the actor under test: rank 0 (the caller's own) or another one."""
    return request.param


Spy = Callable[[type, str], list[tuple[Any, ...]]]
"""``spy(Class, "method")``: the arguments of each call to that async method from now on, which still runs."""


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> Spy:
    """Record the calls to an async method of a class, for the test, as the runtime makes them."""

    def install(owner: type, name: str) -> list[tuple[Any, ...]]:
        calls: list[tuple[Any, ...]] = []
        original = getattr(owner, name)

        async def recording(self: Any, *args: Any) -> Any:
            calls.append(args)
            return await original(self, *args)

        monkeypatch.setattr(owner, name, recording)
        return calls

    return install
