"""The public facade: ``actorch.__all__`` is sorted, complete and importable."""

from __future__ import annotations
import __future__

import importlib
import types

import pytest

import actorch


def isort_key(name: str) -> tuple[int, str]:
    # ruff's RUF022 order: CONSTANTS, then Classes, then functions, each alphabetical.
    if name.isupper():
        return (0, name)
    if name[:1].isupper():
        return (1, name)
    return (2, name)


def public_names() -> set[str]:
    return {
        name
        for name, value in vars(actorch).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)
        and not isinstance(value, __future__._Feature)  # `from __future__ import annotations`
    }


def test_all_is_sorted() -> None:
    assert actorch.__all__ == sorted(actorch.__all__, key=isort_key)


def test_all_has_no_duplicates() -> None:
    assert len(set(actorch.__all__)) == len(actorch.__all__)


def test_all_lists_every_public_name_of_the_package() -> None:
    assert set(actorch.__all__) == public_names()


@pytest.mark.parametrize("name", actorch.__all__)
def test_every_name_in_all_is_importable(name: str) -> None:
    module = importlib.import_module("actorch")
    assert getattr(module, name) is not None
    namespace: dict[str, object] = {}
    exec(f"from actorch import {name}", namespace)
    assert namespace[name] is getattr(actorch, name)


def test_star_import_gives_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from actorch import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(actorch.__all__)


def test_public_objects_claim_the_package_or_a_private_module() -> None:
    for name in actorch.__all__:
        module = getattr(getattr(actorch, name), "__module__", "actorch")
        assert module == "actorch" or module.startswith("actorch._"), (name, module)


def test_testing_helpers_are_exported_from_actorch_testing() -> None:
    testing = importlib.import_module("actorch.testing")
    assert {"LocalWorld", "local_world", "new_event_loop"} <= set(testing.__all__)
    assert testing.__all__ == sorted(testing.__all__, key=isort_key)
