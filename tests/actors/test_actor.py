"""The ``Actor`` base class: endpoint discovery, ``max_concurrency``, runtime-only objects."""

from __future__ import annotations

import pytest

import actorch
from actorch._actors.actor import endpoints_of
from actorch._actors.node.node_system import NodeSystem


class Base(actorch.Actor):
    async def inherited(self) -> int:
        return 1

    async def overridden(self) -> int:
        return 1


class Child(Base):
    async def own(self) -> int:
        return 2

    async def overridden(self) -> int:
        return 2

    def sync_method(self) -> int:
        return 3

    async def _private(self) -> int:
        return 4

    async def __dunder__(self) -> int:
        return 5

    @staticmethod
    async def static() -> int:
        return 6

    @classmethod
    async def klass(cls) -> int:
        return 7

    @property
    def prop(self) -> int:
        return 8

    async def on_start(self) -> None:
        pass

    async def on_stop(self) -> None:
        pass

    attribute = 9


class NoLongerAnEndpoint(Base):
    def inherited(self) -> int:  # type: ignore[override]
        return 0


class Concurrent(actorch.Actor):
    max_concurrency = 4


class InheritsConcurrency(Concurrent):
    pass


def test_endpoints_are_the_public_async_methods_including_inherited_ones() -> None:
    assert set(endpoints_of(Child)) == {"inherited", "overridden", "own"}


def test_endpoints_map_to_the_most_derived_method() -> None:
    assert endpoints_of(Child)["overridden"] is Child.overridden
    assert endpoints_of(Child)["inherited"] is Base.inherited


def test_endpoints_of_a_base_class_are_not_changed_by_subclasses() -> None:
    assert set(endpoints_of(Base)) == {"inherited", "overridden"}
    assert endpoints_of(Base)["overridden"] is Base.overridden


def test_endpoint_overridden_by_a_sync_method_is_no_longer_an_endpoint() -> None:
    assert set(endpoints_of(NoLongerAnEndpoint)) == {"overridden"}


def test_actor_base_class_has_no_endpoints() -> None:
    assert endpoints_of(actorch.Actor) == {}


def test_max_concurrency_defaults_to_one() -> None:
    assert Base.max_concurrency == 1


def test_max_concurrency_is_inherited() -> None:
    assert InheritsConcurrency.max_concurrency == 4


@pytest.mark.parametrize("value", [0, -1, 1.5, "2", True, None])
def test_max_concurrency_must_be_a_positive_int(value: object) -> None:
    with pytest.raises(TypeError, match="max_concurrency"):
        type("Bad", (actorch.Actor,), {"max_concurrency": value})


def test_actor_ref_cannot_be_constructed_by_users() -> None:
    with pytest.raises(TypeError, match="runtime"):
        actorch.ActorRef()


def test_actor_system_cannot_be_constructed_by_users() -> None:
    with pytest.raises(TypeError, match=r"actorch\.run"):
        actorch.ActorSystem()


def test_node_system_cannot_be_constructed_by_users() -> None:
    with pytest.raises(TypeError, match=r"NodeSystem objects are made by actorch\.run"):
        NodeSystem()
