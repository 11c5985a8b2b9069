"""Shared fixtures: a three-node in-process world and the rank a test's actor lives on."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from actorch.testing import LocalWorld, local_world


@pytest.fixture
async def world() -> AsyncIterator[LocalWorld]:
    """Three nodes in this event loop; tests call from rank 0 unless they say otherwise."""
    async with local_world(3, stop_grace=0.5) as running:
        yield running


@pytest.fixture(params=[0, 1], ids=["same node", "other node"])
def on(request: pytest.FixtureRequest) -> int:
    """Rank hosting the actor under test: rank 0 (the caller's own) or another one."""
    return request.param
