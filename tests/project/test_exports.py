"""The public facade: ``actorch`` and its stock submodules each have a sorted, complete, importable ``__all__``.

``actorch`` holds the runtime core; the stock actors live in ``actorch.rl``,
``actorch.replay``, ``actorch.params`` and ``actorch.group`` (the mission's four
are importable from ``actorch`` too); the names that moved out of ``actorch``
still resolve there, with a ``DeprecationWarning`` naming their new home.
"""

from __future__ import annotations
import __future__

import importlib
import importlib.metadata
import types
import warnings

import pytest

import actorch


def isort_key(name: str) -> tuple[int, str]:
    # ruff's RUF022 order: CONSTANTS, then Classes, then functions, each alphabetical.
    if name.isupper():
        return (0, name)
    if name[:1].isupper():
        return (1, name)
    return (2, name)


SUBMODULES = {
    "actorch.rl": ["Agent", "Batch", "Collection", "Collector", "EpisodeStats", "Observer", "Rollout"],
    "actorch.replay": ["PrioritizedReplayBuffer", "ReplayBuffer", "Sample", "ShardedReplayBuffer"],
    "actorch.params": ["ParameterClient", "ParameterServer", "Parameters", "assign_shards"],
    "actorch.group": [
        "ActorGroup",
        "Partitioner",
        "batch_partitioner",
        "dim_partitioner",
        "mean_reducer",
        "sum_reducer",
    ],
}
"""The public submodules of stock objects, and the ``__all__`` each must have."""

ALSO_IN_ACTORCH = {
    "Agent": "actorch.rl",
    "Observer": "actorch.rl",
    "ParameterServer": "actorch.params",
    "ReplayBuffer": "actorch.replay",
}
"""The mission's four: importable from ``actorch`` as well as from their home."""

MOVED = sorted((name, module) for module, names in SUBMODULES.items() for name in names if name not in ALSO_IN_ACTORCH)
"""Names ``actorch`` exported before they moved to a submodule, with it."""

PUBLIC_MODULES = ["actorch", *SUBMODULES]


def public_names(module: types.ModuleType = actorch) -> set[str]:
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)
        and not isinstance(value, __future__._Feature)  # `from __future__ import annotations`
    }


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_all_is_sorted(module: str) -> None:
    names = importlib.import_module(module).__all__
    assert names == sorted(names, key=isort_key)


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_all_has_no_duplicates(module: str) -> None:
    names = importlib.import_module(module).__all__
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_all_lists_every_public_name_of_the_module(module: str) -> None:
    public = importlib.import_module(module)
    assert set(public.__all__) == public_names(public)


@pytest.mark.parametrize(("module", "names"), SUBMODULES.items())
def test_submodule_all_holds_its_stock_names(module: str, names: list[str]) -> None:
    assert importlib.import_module(module).__all__ == names


@pytest.mark.parametrize(
    ("module", "name"),
    [(module, name) for module in PUBLIC_MODULES for name in importlib.import_module(module).__all__],
)
def test_every_name_in_all_is_importable(module: str, name: str) -> None:
    public = importlib.import_module(module)
    assert getattr(public, name) is not None
    namespace: dict[str, object] = {}
    exec(f"from {module} import {name}", namespace)
    assert namespace[name] is getattr(public, name)


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_star_import_gives_exactly_all(module: str) -> None:
    namespace: dict[str, object] = {}
    exec(f"from {module} import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(importlib.import_module(module).__all__)


def test_submodules_are_attributes_of_the_package() -> None:
    for module in SUBMODULES:
        assert getattr(actorch, module.removeprefix("actorch.")) is importlib.import_module(module)


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_public_classes_and_functions_claim_their_public_home(module: str) -> None:
    public = importlib.import_module(module)
    for name in public.__all__:
        value = getattr(public, name)
        if isinstance(value, (type, types.FunctionType)):
            assert value.__module__ == ALSO_IN_ACTORCH.get(name, module), (name, value.__module__)


def test_stock_names_are_not_in_the_core_all_but_the_missions_four() -> None:
    stock = {name for names in SUBMODULES.values() for name in names}
    assert stock & set(actorch.__all__) == set(ALSO_IN_ACTORCH)


@pytest.mark.parametrize(("name", "home"), ALSO_IN_ACTORCH.items())
def test_missions_four_are_the_same_object_in_actorch_and_their_home(name: str, home: str) -> None:
    assert getattr(actorch, name) is getattr(importlib.import_module(home), name)


@pytest.mark.parametrize(("name", "home"), MOVED)
def test_moved_name_resolves_in_actorch_with_a_warning_naming_its_home(name: str, home: str) -> None:
    with pytest.warns(DeprecationWarning, match=rf"actorch\.{name} has moved to {home}\.{name}"):
        old = getattr(actorch, name)
    assert old is getattr(importlib.import_module(home), name)


def test_moved_name_imports_from_actorch_with_a_warning() -> None:
    namespace: dict[str, object] = {}
    with pytest.warns(DeprecationWarning, match="actorch.rl"):
        exec("from actorch import Batch", namespace)
    assert namespace["Batch"] is actorch.rl.Batch


def test_unknown_name_of_actorch_is_an_attribute_error_without_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        unknown = "Nope"
        with pytest.raises(AttributeError, match="'actorch' has no attribute 'Nope'"):
            getattr(actorch, unknown)


def test_version_is_the_installed_distributions() -> None:
    assert actorch.__version__ == importlib.metadata.version("actorch")


def test_testing_helpers_are_exported_from_actorch_testing() -> None:
    testing = importlib.import_module("actorch.testing")
    assert {"LocalWorld", "local_world", "new_event_loop"} <= set(testing.__all__)
    assert testing.__all__ == sorted(testing.__all__, key=isort_key)
