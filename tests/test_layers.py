"""Imports go downward through the layers of DESIGN.md; torch RPC and msgpack stay in their modules."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "actorch"

LAYERS = {
    "_errors": 1,
    "_names": 1,
    "_deadline": 1,
    "_codec": 2,
    "_tensorfile": 2,
    "_bridge": 3,
    "_transport": 4,
    "_network": 4,
    "_rpc_transport": 4,
    "_envelope": 5,
    "_flow": 5,
    "_batching": 5,
    "_mailbox": 5,
    "_wire": 5,
    "_node": 5,
    "_inbound": 5,
    "_outbound": 5,
    "_actor": 6,
    "_ref": 6,
    "_service": 8,
    "_restart": 6,
    "_supervisor": 8,
    "_registry": 7,
    "_events": 7,
    "_system": 8,
    "_logging": 8,
    "_launcher": 8,
    "_lifecycle": 8,
    "_runner": 8,
    "_parameter_server": 9,
    "_parameter_client": 9,
    "_replay": 9,
    "_replay_client": 9,
    "_rl": 9,
    "_prioritized": 9,
    "_group": 9,
    "_partition": 9,
    "testing": 10,
    "__init__": 10,
}

ONLY_IN = {
    "torch.distributed.rpc": {"_rpc_transport"},
    "msgpack": {"_codec"},
}


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_modules(tree: ast.AST, *, skip_type_checking: bool) -> set[str]:
    """Dotted names of everything imported in ``tree`` (``from a import b`` gives ``a.b``)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if skip_type_checking and isinstance(node, ast.If) and is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = "actorch" if node.level else (node.module or "")
            if node.level and node.module:
                base = f"actorch.{node.module}"
            found.update(f"{base}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def package_modules_imported(tree: ast.AST) -> set[str]:
    """The actorch modules (by short name) that ``tree`` imports at run time."""
    modules: set[str] = set()
    for name in imported_modules(tree, skip_type_checking=True):
        parts = name.split(".")
        if parts[0] != "actorch":
            continue
        if len(parts) > 1 and parts[1] in LAYERS:
            modules.add(parts[1])
        elif len(parts) == 1 or parts[1] not in LAYERS:
            modules.add("__init__")  # a name taken from the package facade
    return modules


def upward_imports(module: str, source: str) -> list[str]:
    layer = LAYERS[module]
    return sorted(
        f"{module} (layer {layer}) imports {target} (layer {LAYERS[target]})"
        for target in package_modules_imported(ast.parse(source))
        if target != module and LAYERS[target] > layer
    )


def imports_of(module: str, prefix: str) -> bool:
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    return any(
        name == prefix or name.startswith(prefix + ".") for name in imported_modules(tree, skip_type_checking=False)
    )


MODULES = sorted(path.stem for path in PACKAGE.glob("*.py"))


def test_every_module_of_the_package_has_a_layer() -> None:
    assert set(MODULES) == set(LAYERS)


@pytest.mark.parametrize("module", MODULES)
def test_module_imports_only_from_its_layer_or_below(module: str) -> None:
    assert upward_imports(module, (PACKAGE / f"{module}.py").read_text()) == []


@pytest.mark.parametrize(("banned", "allowed"), ONLY_IN.items())
def test_banned_library_is_imported_only_by_its_modules(banned: str, allowed: set[str]) -> None:
    importers = {module for module in MODULES if imports_of(module, banned)}
    assert importers <= allowed
    assert importers, f"no module imports {banned}: the check is looking for the wrong name"


STOCK = sorted(module for module, layer in LAYERS.items() if layer == 9)


def private_names_imported(source: str) -> list[str]:
    """Names a stock module takes from the runtime (layers below 9) that are not in ``actorch.__all__``."""
    import actorch  # noqa: PLC0415 - the facade is what is checked against

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("actorch")):
            if LAYERS.get((node.module or "").rpartition(".")[2]) == 9:
                continue  # stock modules may share helpers among themselves
            found += [f"{node.module}.{a.name}" for a in node.names if a.name not in actorch.__all__]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("actorch")]
    return found


@pytest.mark.parametrize("module", STOCK)
def test_stock_module_uses_only_the_public_api(module: str) -> None:
    assert private_names_imported((PACKAGE / f"{module}.py").read_text()) == []


@pytest.mark.parametrize(
    "source",
    ["from actorch._base.codec import Codec", "import actorch._engine.node", "import actorch", "from ._ref import _REF_CODE"],
)
def test_public_api_check_flags_a_private_name(source: str) -> None:
    assert private_names_imported(source)


# The checker itself, on sources written to break the rules.


@pytest.mark.parametrize(
    "source",
    [
        "from actorch._actors.system import ActorSystem",
        "import actorch._actors.system",
        "from actorch import _system",
        "from . import _system",
        "from ._system import ActorSystem",
        "from actorch import Actor",
        "def f():\n    from actorch._actors.registry import Registry",
    ],
)
def test_layer_check_flags_an_upward_import(source: str) -> None:
    assert upward_imports("_codec", source)


@pytest.mark.parametrize(
    "source",
    [
        "from actorch._base.errors import ActorchError",
        "from actorch import _errors",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from actorch._actors.system import ActorSystem",
        "import typing\nif typing.TYPE_CHECKING:\n    import actorch._engine.node",
        "import torch",
    ],
)
def test_layer_check_allows_downward_and_annotation_only_imports(source: str) -> None:
    assert upward_imports("_codec", source) == []


@pytest.mark.parametrize(
    "source",
    [
        "import torch.distributed.rpc as rpc",
        "from torch.distributed import rpc",
        "from torch.distributed.rpc import api",
    ],
)
def test_banned_check_sees_every_spelling_of_a_torch_rpc_import(source: str) -> None:
    names = imported_modules(ast.parse(source), skip_type_checking=False)
    assert any(name == "torch.distributed.rpc" or name.startswith("torch.distributed.rpc.") for name in names)


def test_public_api_check_allows_helpers_shared_between_stock_modules() -> None:
    assert private_names_imported("from actorch._stock.replay import _check_capacity") == []
