"""Imports go downward through the layers of DESIGN.md and in no cycle; torch RPC and msgpack stay in one module each.

A module's layer is its subpackage of ``actorch`` (``_base`` lowest, ``_stock``
highest); the facade, ``actorch`` and ``actorch.testing``, sits on top. The
modules are found by walking the package, so a new module needs no entry here,
and a module outside every layer fails. Imports are read from the source, at
any depth (in functions too), and relative ones are resolved. Annotation-only
imports (under ``if TYPE_CHECKING:``) count like the others: a layer never
names what sits above it, and a cycle made of annotations is still a cycle,
with one named exception (``ANNOTATION_ONLY_TIE``).

Inside ``_actors`` and inside ``_launch``, the rooms (a folder, or a module of
the layer's own) stand on floors (``ACTORS_FLOORS``, ``LAUNCH_FLOORS``), and a
module imports nothing from a room on a higher floor, by the same reading of
imports. No module above the engine but the host reads the engine's ``Node``
off another object (``host.node``): the host offers public methods instead.
"""

from __future__ import annotations

import ast
import re
from collections import deque
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "actorch"

LAYERS = ("_base", "_transport", "_engine", "_actors", "_launch", "_stock")
"""The subpackages of ``actorch``, lowest layer first (DESIGN.md, "The runtime, layer by layer")."""

FACADE = frozenset(
    {
        "actorch",
        "actorch.testing",
        "actorch.__main__",
        "actorch.rl",
        "actorch.replay",
        "actorch.params",
        "actorch.group",
    }
)
"""The public modules, one layer above all of ``LAYERS``: the package, its helpers, its command and the stock homes."""

FACADE_LAYER = len(LAYERS)
STOCK_LAYER = LAYERS.index("_stock")

ONLY_IN = {
    "torch.distributed.rpc": {"actorch._transport.torch_rpc.rpc", "actorch._transport.torch_rpc.elastic"},
    "msgpack": {"actorch._base.codec"},
    "opentelemetry": {"actorch._engine.otel"},
}
"""Libraries that only some modules may import, and those modules (torch RPC: the transport's two).

OpenTelemetry is an optional extra: its one module is imported only when the ``otel`` option is on.
"""

ANNOTATION_ONLY_TIE = {
    "actorch._actors.actor": frozenset({"actorch._actors.ref", "actorch._actors.system"}),
}
"""The one import cycle allowed: ``Actor``'s annotations name ``ActorRef`` and ``ActorSystem``, both built on it.

These imports, and only while every one of them stays under ``TYPE_CHECKING``,
are left out of the cycle check. Counted in, they make one circle of exactly
these three modules: ``system`` holds the system's public surface only (its
implementation, ``node.node_system``, and the modules it builds on, names ``Actor``
without being named by it), so the circle cannot take in the rest of ``_actors``.
"""

ACTORS = "actorch._actors"

ACTORS_FLOORS: tuple[frozenset[str], ...] = (
    frozenset({"restart", "where", "spawn_request", "node_request", "node_share"}),
    frozenset(
        {"actor", "ref", "system", "system_endpoints", "registry", "events", "broadcast", "process_groups", "tracing"}
    ),
    frozenset({"placement"}),
    frozenset({"relocation"}),
    frozenset({"node"}),
)
"""The rooms of ``_actors``, lowest floor first, as its ``__init__.py`` lists them: a folder, or a module of its own.

The vocabulary (the records every room speaks), the core (actors, refs, the
system's surface, names, events), then placement, relocation and one node's
part of the system. Rooms on one floor may import each other (the cycle check
still holds them); a room never imports from a floor above its own.
"""

LAUNCH = "actorch._launch"

LAUNCH_FLOORS: tuple[frozenset[str], ...] = (
    frozenset({"options"}),
    frozenset({"services"}),
    frozenset({"world"}),
    frozenset({"cli"}),
)
"""The rooms of ``_launch``, lowest floor first, as its ``__init__.py`` lists them.

The options of a launch (resting on nothing they configure), the running
system's services, the world's start, and the ``actorch`` command on top.
"""

NODE_OWNER = "actorch._actors.node.host"
"""The one module above the engine that reads its ``Node``: the host, which owns it."""


# ---------------------------------------------------------------------- reading imports


@dataclass(frozen=True)
class Layout:
    """The modules of a package by dotted name, and which of them are packages (``__init__.py``)."""

    modules: frozenset[str]
    packages: frozenset[str]

    def absolute(self, importer: str, level: int, module: str | None) -> str:
        """The absolute name that ``from <level dots><module> import ...`` in ``importer`` starts from."""
        if not level:
            return module or ""
        package = importer.split(".") if importer in self.packages else importer.split(".")[:-1]
        if level - 1 >= len(package):
            raise ValueError(f"{importer}: a relative import of level {level} goes above the top package")
        base = package[: len(package) - (level - 1)]
        return ".".join([*base, module] if module else base)


def discover(root: Path = PACKAGE) -> tuple[Layout, dict[str, str]]:
    """Every module under ``root`` (a package folder), and its source, by dotted name."""
    sources: dict[str, str] = {}
    packages: set[str] = set()
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
            packages.add(".".join(parts))
        sources[".".join(parts)] = path.read_text()
    return Layout(frozenset(sources), frozenset(packages)), sources


LAYOUT, SOURCES = discover()
MODULES = sorted(SOURCES)


def is_ours(name: str) -> bool:
    return name == "actorch" or name.startswith("actorch.")


def layer_of(module: str) -> int | None:
    """The layer of an ``actorch`` module: its subpackage's place in ``LAYERS``, the facade above; None outside."""
    if module in FACADE:
        return FACADE_LAYER
    parts = module.split(".")
    if len(parts) >= 2 and parts[0] == "actorch" and parts[1] in LAYERS:
        return LAYERS.index(parts[1])
    return None


def layer_name(layer: int) -> str:
    return "the facade" if layer == FACADE_LAYER else f"layer {layer + 1} ({LAYERS[layer]})"


@dataclass(frozen=True)
class Import:
    """One name one module imports: ``target`` is the module it comes from (or is)."""

    importer: str
    target: str
    name: str | None
    """The name a ``from`` import takes (``cell`` in ``from . import cell``); None for ``import x``."""
    line: int
    annotation_only: bool

    def __str__(self) -> str:
        note = " (annotation-only)" if self.annotation_only else ""
        return f"{self.importer}:{self.line} imports {self.target}{note}"


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_in(module: str, source: str, layout: Layout = LAYOUT) -> list[Import]:
    """Every import in ``source`` (the text of ``module``), at any depth, with relative ones resolved.

    ``from pkg import name`` imports the module ``pkg.name`` when the package
    has such a module, else the name ``name`` of module ``pkg``. Outside the
    package there is no telling, so ``from torch.distributed import rpc`` is
    read as an import of ``torch.distributed.rpc``: that is what the library
    checks need.
    """
    found: list[Import] = []

    def visit(node: ast.AST, annotation_only: bool) -> None:
        if isinstance(node, ast.If) and is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, annotation_only)
            return
        if isinstance(node, ast.Import):
            found.extend(Import(module, alias.name, None, node.lineno, annotation_only) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = layout.absolute(module, node.level, node.module)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                target = full if full in layout.modules or not is_ours(base) else base
                found.append(Import(module, target, alias.name, node.lineno, annotation_only))
        for child in ast.iter_child_nodes(node):
            visit(child, annotation_only)

    visit(ast.parse(source), False)
    return found


# ---------------------------------------------------------------------- the rules


def upward_imports(module: str, source: str, layout: Layout = LAYOUT) -> list[str]:
    """The imports of ``module`` that reach a higher layer (or a module in none)."""
    layer = layer_of(module)
    if layer is None:
        return [f"{module} is in no layer"]
    found = []
    for imported in imports_in(module, source, layout):
        if not is_ours(imported.target):
            continue
        target_layer = layer_of(imported.target)
        if target_layer is None:
            found.append(f"{imported}, which is in no layer")
        elif target_layer > layer:
            found.append(f"{imported}: {layer_name(target_layer)} is above {layer_name(layer)}")
    return found


Edges = dict[tuple[str, str], list[Import]]


def import_graph(sources: Mapping[str, str], layout: Layout = LAYOUT) -> Edges:
    """The imports between the modules of ``sources``, by (importer, imported module)."""
    edges: Edges = {}
    for module, source in sources.items():
        for imported in imports_in(module, source, layout):
            if imported.target in sources and imported.target != module:
                edges.setdefault((module, imported.target), []).append(imported)
    return edges


def without_the_allowed_tie(edges: Edges) -> Edges:
    """``edges`` less those of ``ANNOTATION_ONLY_TIE`` that are annotation-only."""
    return {
        (importer, target): imports
        for (importer, target), imports in edges.items()
        if not (
            target in ANNOTATION_ONLY_TIE.get(importer, ()) and all(imported.annotation_only for imported in imports)
        )
    }


def strongly_connected(edges: Edges) -> list[set[str]]:
    """The modules that import each other in a circle (with every import counted), one set per circle."""
    graph: dict[str, set[str]] = {}
    for importer, target in edges:
        graph.setdefault(importer, set()).add(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(module: str) -> None:  # Tarjan's
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph.get(module, ())):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = set()
            while not component or module not in component:
                component.add(stack.pop())
            if len(component) > 1:
                found.append(component)

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def shortest_path(graph: Mapping[str, Collection[str]], start: str, end: str) -> list[str] | None:
    """The modules on a shortest import path from ``start`` to ``end`` (both included), or None."""
    came_from: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        if node == end:
            path = [node]
            while (previous := came_from[path[-1]]) is not None:
                path.append(previous)
            return path[::-1]
        for following in sorted(graph.get(node, ())):
            if following not in came_from:
                came_from[following] = node
                queue.append(following)
    return None


def import_cycles(edges: Edges) -> list[list[str]]:
    """For each import on a cycle, the shortest cycle through it; each cycle once, from its first module by name."""
    graph: dict[str, set[str]] = {}
    for importer, target in edges:
        graph.setdefault(importer, set()).add(target)
    cycles: set[tuple[str, ...]] = set()
    for importer, target in edges:
        back = shortest_path(graph, target, importer)
        if back is not None:
            cycle = [importer, *back[:-1]]
            first = cycle.index(min(cycle))
            cycles.add(tuple(cycle[first:] + cycle[:first]))
    return sorted(list(cycle) for cycle in cycles)


def describe_cycles(cycles: list[list[str]], edges: Edges) -> str:
    """Each cycle as ``a -> b -> a``, followed by the import lines that make it."""
    lines = []
    for cycle in cycles:
        lines.append(" -> ".join([*cycle, cycle[0]]))
        for importer, target in zip(cycle, [*cycle[1:], cycle[0]], strict=True):
            lines.extend(dict.fromkeys(f"    {imported}" for imported in edges[importer, target]))  # a line once
    return "\n".join(lines)


def imports_library(module: str, source: str, library: str, layout: Layout = LAYOUT) -> bool:
    return any(
        imported.target == library or imported.target.startswith(library + ".")
        for imported in imports_in(module, source, layout)
    )


def exported_names(init: Path = PACKAGE / "__init__.py") -> frozenset[str]:
    """The names of the facade's ``__all__``, read from its source (a literal list)."""
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
        ):
            return frozenset(ast.literal_eval(node.value))
    raise AssertionError(f"{init} has no literal __all__")


def non_public_imports(module: str, source: str, public: Collection[str], layout: Layout = LAYOUT) -> list[str]:
    """What a stock module takes from the layers below that is not a name of ``public``.

    Stock modules may import each other freely; from the runtime they take
    only names that ``actorch`` exports, never a module.
    """
    found = []
    for imported in imports_in(module, source, layout):
        if not is_ours(imported.target) or layer_of(imported.target) == STOCK_LAYER:
            continue
        if imported.name is None:
            found.append(f"{imported}: a module, not a name of actorch.__all__")
        elif imported.name not in public:
            found.append(f"{imported}: {imported.name} is not in actorch.__all__")
    return found


@dataclass(frozen=True)
class Floors:
    """The rooms of one layer (a folder, or a module of the layer's own) on their floors, lowest first."""

    layer: str
    """The layer's package: ``actorch._actors``."""
    floors: tuple[frozenset[str], ...]
    name: str
    """What the floors are called in a message: ``ACTORS_FLOORS``."""

    def room_of(self, module: str) -> str | None:
        """The room of a module of the layer: its folder or its own name (``placement``, ``ref``); None outside."""
        parts = module.split(".")
        if module.startswith(self.layer + ".") and len(parts) >= 3:
            return parts[2]
        return None

    def floor_of(self, module: str) -> int | None:
        """The floor of a module's room (0 lowest); None outside the layer or on no floor."""
        room = self.room_of(module)
        return next((index for index, rooms in enumerate(self.floors) if room in rooms), None)

    def upward(self, module: str, source: str, layout: Layout = LAYOUT) -> list[str]:
        """The imports of a module of the layer that reach a room on a higher floor (or a module on none)."""
        floor = self.floor_of(module)
        if self.room_of(module) is None:
            return []
        if floor is None:
            return [f"{module} is in no room of {self.name}"]
        found = []
        for imported in imports_in(module, source, layout):
            if self.room_of(imported.target) is None:
                continue
            target_floor = self.floor_of(imported.target)
            if target_floor is None:
                found.append(f"{imported}, which is in no room of {self.name}")
            elif target_floor > floor:
                found.append(
                    f"{imported}: {self.room_of(imported.target)} (floor {target_floor + 1}) is above "
                    f"{self.room_of(module)} (floor {floor + 1})"
                )
        return found

    def said(self, docstring: str) -> dict[int, frozenset[str]]:
        """The rooms each item of a numbered list in ``docstring`` puts on its floor (``3. ``placement/``: ...``).

        A name counts as a room when the layer has a folder or a module by that name.
        """
        rooms = {self.room_of(module) for module in MODULES} - {None}
        said: dict[int, set[str]] = {}
        current: int | None = None
        for line in docstring.splitlines():
            numbered = re.match(r"(\d+)\. ", line)
            if numbered:
                current = int(numbered[1])
                said[current] = set()
            elif not line.strip():
                current = None
            if current is not None:
                said[current] |= {name for name in re.findall(r"``([\w]+)/?``", line) if name in rooms}
        return {floor: frozenset(names) for floor, names in said.items()}


ACTORS_ROOMS = Floors(ACTORS, ACTORS_FLOORS, "ACTORS_FLOORS")
LAUNCH_ROOMS = Floors(LAUNCH, LAUNCH_FLOORS, "LAUNCH_FLOORS")


def node_reaches(module: str, source: str) -> list[str]:
    """Where ``module`` reads or sets another object's ``node``: ``host.node.log``, ``node = host.node``.

    The engine's ``Node`` belongs to the host: the rest reach what they need
    through the host's public methods, or are given it (``self.node``).
    """
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in ("node", "_node"):
            if isinstance(node.value, ast.Name) and node.value.id in OWN:
                continue
            found.append(f"{module}:{node.lineno} reaches through {ast.unparse(node)}")
    return found


OWN = frozenset({"self", "cls"})


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_attributes(sources: Mapping[str, str]) -> frozenset[str]:
    """The underscored attributes the classes of ``sources`` define: set on ``self`` or ``cls``, or in a class body."""
    found: set[str] = set()
    for source in sources.values():
        for node in ast.walk(ast.parse(source)):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in OWN
            ):
                found.add(node.attr)
            elif isinstance(node, ast.ClassDef):
                for statement in node.body:
                    if isinstance(statement, ast.AnnAssign):
                        targets = [statement.target]
                    elif isinstance(statement, ast.Assign):
                        targets = statement.targets
                    else:
                        continue
                    found.update(target.id for target in targets if isinstance(target, ast.Name))
    return frozenset(name for name in found if is_private(name))


def private_reaches(module: str, source: str, private: Collection[str], layout: Layout = LAYOUT) -> list[str]:
    """Where ``module`` takes an underscored name from a lower layer, or reads or sets one of ``private`` elsewhere.

    An attribute of ``private`` counts on any object but the module's own
    ``self`` and ``cls``: the object it is read from is not known, so the
    names are those the lower layers' classes define.
    """
    layer = layer_of(module)
    found = [
        f"{imported}: {imported.name} is private"
        for imported in imports_in(module, source, layout)
        if imported.name is not None
        and is_private(imported.name)
        and is_ours(imported.target)
        and (layer_of(imported.target) or 0) < (layer or 0)
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in private:
            if isinstance(node.value, ast.Name) and node.value.id in OWN:
                continue
            found.append(f"{module}:{node.lineno} reaches {ast.unparse(node)}")
    return found


# ---------------------------------------------------------------------- the package


def test_every_module_of_the_package_is_in_a_layer() -> None:
    assert [module for module in MODULES if layer_of(module) is None] == []


def test_the_walk_finds_modules_in_every_layer_and_the_facade() -> None:
    assert {layer_of(module) for module in MODULES} == set(range(FACADE_LAYER + 1))
    assert set(MODULES) >= FACADE


@pytest.mark.parametrize("module", MODULES)
def test_module_imports_nothing_from_a_higher_layer(module: str) -> None:
    assert upward_imports(module, SOURCES[module]) == []


def test_no_import_cycle_among_the_modules_of_the_package() -> None:
    edges = without_the_allowed_tie(import_graph(SOURCES))
    cycles = import_cycles(edges)
    if cycles:
        pytest.fail(
            f"{len(cycles)} import cycle{'s' * (len(cycles) > 1)} among actorch's modules "
            f"(annotation-only imports count too; only ANNOTATION_ONLY_TIE is allowed):\n"
            f"{describe_cycles(cycles, edges)}",
            pytrace=False,
        )


def test_the_only_import_circle_counting_annotations_is_the_tie_of_actor_with_ref_and_system() -> None:
    ((importer, targets),) = ANNOTATION_ONLY_TIE.items()
    assert strongly_connected(import_graph(SOURCES)) == [{importer, *targets}]


@pytest.mark.parametrize(("library", "allowed"), ONLY_IN.items())
def test_library_is_imported_only_by_its_one_module(library: str, allowed: set[str]) -> None:
    importers = {module for module in MODULES if imports_library(module, SOURCES[module], library)}
    assert importers <= allowed
    assert importers, f"no module imports {library}: the check is looking for the wrong name"


STOCK = [module for module in MODULES if layer_of(module) == STOCK_LAYER]


@pytest.mark.parametrize("module", STOCK)
def test_stock_module_takes_only_public_names_from_the_runtime(module: str) -> None:
    assert non_public_imports(module, SOURCES[module], exported_names()) == []


LAUNCH_LAYER = LAYERS.index("_launch")
LAUNCH_AND_TESTING = [module for module in MODULES if layer_of(module) == LAUNCH_LAYER or module == "actorch.testing"]
PRIVATE_BELOW_LAUNCH = private_attributes(
    {module: source for module, source in SOURCES.items() if (layer_of(module) or LAUNCH_LAYER) < LAUNCH_LAYER}
)


@pytest.mark.parametrize("module", LAUNCH_AND_TESTING)
def test_launch_module_reaches_nothing_private_of_a_lower_layer(module: str) -> None:
    assert private_reaches(module, SOURCES[module], PRIVATE_BELOW_LAUNCH) == []


TRANSPORT_FOR_LAUNCH = frozenset(
    {
        "actorch._transport.kinds",
        "actorch._transport.kind",
        "actorch._transport.world",
        "actorch._transport.base",
        "actorch._transport.capabilities",
        "actorch._transport.membership",
        "actorch._transport.network",
    }
)
"""What the launch layer may import of ``_transport``: the table of kinds and what every kind is written against.

Never a kind's own modules (torch RPC's, in-process, faulty, the lane): the
launch opens, joins and ends every kind through the table (``kinds``).
"""

LAUNCH_LAYER_MODULES = [module for module in MODULES if layer_of(module) == LAUNCH_LAYER]


def transport_imports(module: str, source: str) -> set[str]:
    """The modules of ``_transport`` that ``module`` imports."""
    return {
        imported.target
        for imported in imports_in(module, source)
        if imported.target.startswith("actorch._transport.") or imported.target == "actorch._transport"
    }


@pytest.mark.parametrize("module", LAUNCH_LAYER_MODULES)
def test_launch_module_reaches_transports_only_through_the_table_of_kinds(module: str) -> None:
    assert transport_imports(module, SOURCES[module]) - TRANSPORT_FOR_LAUNCH == set()


def test_the_launch_layer_opens_its_transports_through_the_table() -> None:
    used = set().union(*(transport_imports(module, SOURCES[module]) for module in LAUNCH_LAYER_MODULES))
    assert "actorch._transport.kinds" in used


def test_no_kind_of_transport_is_among_what_the_launch_may_import() -> None:
    from actorch._transport.kinds import KINDS  # noqa: PLC0415 - the table, read where it is checked

    homes = {kind.open.__module__ for kind in KINDS}
    assert homes
    assert homes.isdisjoint(TRANSPORT_FOR_LAUNCH)
    assert "actorch._transport.lane.transport" not in TRANSPORT_FOR_LAUNCH


def test_the_launch_check_flags_an_import_of_a_kinds_own_module() -> None:
    source = "from actorch._transport.torch_rpc.rpc import active_transport\nfrom actorch._transport import kinds"
    assert transport_imports("actorch._launch.world.start", source) - TRANSPORT_FOR_LAUNCH == {
        "actorch._transport.torch_rpc.rpc"
    }


def test_the_private_attributes_below_the_launcher_include_those_of_the_system() -> None:
    assert {"_host", "_shutdown", "_caller", "_actor_id"} <= PRIVATE_BELOW_LAUNCH


FLOORED = (ACTORS_ROOMS, LAUNCH_ROOMS)
"""The layers whose rooms stand on floors."""
FLOORED_MODULES = [(floors, module) for floors in FLOORED for module in MODULES if floors.room_of(module) is not None]
ABOVE_THE_ENGINE = [
    module for module in MODULES if (layer_of(module) or 0) >= LAYERS.index("_actors") and module != NODE_OWNER
]


@pytest.mark.parametrize("floors", FLOORED, ids=lambda floors: floors.layer)
def test_every_module_of_a_floored_layer_stands_in_a_room_on_a_floor(floors: Floors) -> None:
    modules = [module for module in MODULES if layer_of(module) == layer_of(floors.layer) and module != floors.layer]
    assert [module for module in modules if floors.floor_of(module) is None] == []
    assert {floors.room_of(module) for module in modules} == frozenset().union(*floors.floors)


@pytest.mark.parametrize(("floors", "module"), FLOORED_MODULES, ids=[module for _, module in FLOORED_MODULES])
def test_module_imports_nothing_from_a_room_on_a_higher_floor(floors: Floors, module: str) -> None:
    assert floors.upward(module, SOURCES[module]) == []


@pytest.mark.parametrize("module", ABOVE_THE_ENGINE)
def test_no_module_but_the_host_reaches_through_to_the_node(module: str) -> None:
    assert node_reaches(module, SOURCES[module]) == []


def test_the_host_is_the_module_that_holds_the_node() -> None:
    assert node_reaches(NODE_OWNER, SOURCES[NODE_OWNER]) == []  # its own: self.node
    assert "self.node = Node(" in SOURCES[NODE_OWNER]


@pytest.mark.parametrize("floors", FLOORED, ids=lambda floors: floors.layer)
def test_a_floored_package_lists_its_floors_as_the_check_holds_them(floors: Floors) -> None:
    docstring = ast.get_docstring(ast.parse(SOURCES[floors.layer])) or ""
    assert floors.said(docstring) == {floor + 1: rooms for floor, rooms in enumerate(floors.floors)}


def test_the_options_of_a_launch_stand_on_the_lowest_floor_of_the_launch_layer() -> None:
    assert LAUNCH_ROOMS.floor_of("actorch._launch.options.system_options") == 0
    assert LAUNCH_ROOMS.floor_of("actorch._launch.cli.command") == len(LAUNCH_FLOORS) - 1


# ---------------------------------------------------------------------- the checker, on sources that break the rules

SAMPLE = Layout(
    modules=frozenset(
        {
            "actorch",
            "actorch.testing",
            "actorch._base",
            "actorch._base.codec",
            "actorch._base.errors",
            "actorch._engine",
            "actorch._engine.cell",
            "actorch._engine.node",
            "actorch._actors",
            "actorch._actors.actor",
            "actorch._actors.ref",
            "actorch._actors.system",
            "actorch._stock",
            "actorch._stock.replay",
        }
    ),
    packages=frozenset({"actorch", "actorch._base", "actorch._engine", "actorch._actors", "actorch._stock"}),
)
"""A package laid out like actorch, for the checker's own tests."""

ACTORS_SAMPLE = Layout(
    modules=frozenset(
        {
            "actorch",
            "actorch._base",
            "actorch._base.codec",
            "actorch._actors",
            "actorch._actors.where",
            "actorch._actors.ref",
            "actorch._actors.system",
            "actorch._actors.registry",
            "actorch._actors.newroom",
            "actorch._actors.placement",
            "actorch._actors.placement.fit",
            "actorch._actors.placement.where_placer",
            "actorch._actors.relocation",
            "actorch._actors.relocation.spec",
            "actorch._actors.node",
            "actorch._actors.node.host",
            "actorch._actors.node.service",
        }
    ),
    packages=frozenset(
        {
            "actorch",
            "actorch._base",
            "actorch._actors",
            "actorch._actors.placement",
            "actorch._actors.relocation",
            "actorch._actors.node",
        }
    ),
)
"""The ``_actors`` layer laid out in rooms, for the floor check's own tests."""


@pytest.mark.parametrize(
    ("module", "expected"),
    [
        ("actorch._base.errors", 0),
        ("actorch._base", 0),
        ("actorch._transport.torch_rpc.rpc", 1),
        ("actorch._stock.replay", STOCK_LAYER),
        ("actorch._engine.sub.deeper", 2),
        ("actorch", FACADE_LAYER),
        ("actorch.testing", FACADE_LAYER),
        ("actorch._errors", None),
        ("actorch.extra.thing", None),
        ("actorch_other", None),
    ],
)
def test_layer_of_a_module_is_its_subpackage(module: str, expected: int | None) -> None:
    assert layer_of(module) == expected


@pytest.mark.parametrize(
    ("importer", "source", "target"),
    [
        ("actorch._engine.node", "from . import cell", "actorch._engine.cell"),
        ("actorch._engine.node", "from .cell import Cell", "actorch._engine.cell"),
        ("actorch._engine.node", "from . import DEFAULT_STREAM_WINDOW", "actorch._engine"),
        ("actorch._engine.node", "from .. import _base", "actorch._base"),
        ("actorch._engine.node", "from .._base.errors import ActorchError", "actorch._base.errors"),
        ("actorch._engine.node", "from .. import Actor", "actorch"),
        ("actorch._engine", "from . import cell", "actorch._engine.cell"),
        ("actorch._engine", "from .node import Node", "actorch._engine.node"),
        ("actorch", "from ._engine import cell", "actorch._engine.cell"),
        ("actorch", "from . import testing", "actorch.testing"),
        ("actorch._engine.node", "from actorch._engine import cell as _cell", "actorch._engine.cell"),
        ("actorch._engine.node", "from actorch._engine.cell import Cell", "actorch._engine.cell"),
        ("actorch._engine.node", "import actorch._engine.cell as cell", "actorch._engine.cell"),
    ],
)
def test_import_resolves_to_the_module_it_loads(importer: str, source: str, target: str) -> None:
    assert [imported.target for imported in imports_in(importer, source, SAMPLE)] == [target]


def test_relative_import_above_the_top_package_is_an_error() -> None:
    with pytest.raises(ValueError, match="above the top package"):
        imports_in("actorch._engine.node", "from ... import x", SAMPLE)


@pytest.mark.parametrize(
    "source",
    [
        "from actorch._actors.system import ActorSystem",
        "import actorch._actors.system",
        "import actorch._actors.system as system",
        "from actorch import _actors",
        "from actorch._actors import system",
        "from .. import _actors",
        "from .._engine.node import Node",
        "from .. import Actor",
        "from actorch import Actor",
        "import actorch",
        "import actorch.testing",
        "def f():\n    from actorch._actors.ref import ActorRef",
        "class C:\n    def m(self):\n        import actorch._stock.replay",
        "try:\n    from actorch._engine import cell\nexcept ImportError:\n    cell = None",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from actorch._actors.system import ActorSystem",
        "import typing\nif typing.TYPE_CHECKING:\n    import actorch._engine.node",
        "if TYPE_CHECKING:\n    pass\nelse:\n    from actorch._engine import node",
        "from actorch._nowhere import thing",
    ],
)
def test_layer_check_flags_an_upward_import(source: str) -> None:
    assert upward_imports("actorch._base.codec", source, SAMPLE)


@pytest.mark.parametrize(
    "source",
    [
        "from actorch._base.errors import ActorchError",
        "from actorch._base import errors",
        "from . import errors",
        "from .errors import ActorchError",
        "from .. import _base",
        "import actorch._base.errors",
        "def f():\n    from .errors import ActorchError",
        "import torch\nfrom torch import nn",
    ],
)
def test_layer_check_allows_an_import_from_the_same_layer_or_below(source: str) -> None:
    assert upward_imports("actorch._base.codec", source, SAMPLE) == []


def test_layer_check_lets_the_facade_import_every_layer() -> None:
    source = "from actorch._stock.replay import ReplayBuffer\nfrom actorch._base.errors import ActorchError"
    assert upward_imports("actorch", source, SAMPLE) == []
    assert upward_imports("actorch.testing", "from actorch import Actor", SAMPLE) == []


def test_layer_check_names_the_line_and_both_layers() -> None:
    source = "import os\n\nif TYPE_CHECKING:\n    from actorch._actors.ref import ActorRef\n"
    assert upward_imports("actorch._engine.cell", source, SAMPLE) == [
        "actorch._engine.cell:4 imports actorch._actors.ref (annotation-only): "
        "layer 4 (_actors) is above layer 3 (_engine)"
    ]


@pytest.mark.parametrize(
    "source",
    [
        "import torch.distributed.rpc",
        "import torch.distributed.rpc as rpc",
        "from torch.distributed import rpc",
        "from torch.distributed import rpc as torch_rpc",
        "from torch.distributed.rpc import api",
        "from torch.distributed.rpc.functions import async_execution",
        "def f():\n    import torch.distributed.rpc",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from torch.distributed import rpc",
    ],
)
def test_library_check_sees_every_spelling_of_a_torch_rpc_import(source: str) -> None:
    assert imports_library("actorch._engine.node", source, "torch.distributed.rpc", SAMPLE)


@pytest.mark.parametrize(
    "source",
    [
        "import torch",
        "import torch.distributed as dist",
        "from torch.distributed import ProcessGroup",
        "from actorch._transport import rpc",
        "import rpc_tools",
    ],
)
def test_library_check_ignores_other_imports(source: str) -> None:
    assert not imports_library("actorch._engine.node", source, "torch.distributed.rpc", SAMPLE)


@pytest.mark.parametrize("source", ["import msgpack", "from msgpack import packb", "import msgpack.ext as ext"])
def test_library_check_sees_a_msgpack_import(source: str) -> None:
    assert imports_library("actorch._engine.node", source, "msgpack", SAMPLE)


def cycles_of(sources: dict[str, str]) -> list[list[str]]:
    layout = Layout(frozenset(sources), SAMPLE.packages)
    return import_cycles(without_the_allowed_tie(import_graph(sources, layout)))


def test_cycle_check_finds_a_cycle_made_by_an_annotation_only_import() -> None:
    sources = {
        "actorch._engine.cell": "if TYPE_CHECKING:\n    from actorch._engine.node import Node",
        "actorch._engine.node": "from . import cell",
    }
    assert cycles_of(sources) == [["actorch._engine.cell", "actorch._engine.node"]]


def test_cycle_check_finds_a_longer_cycle_through_function_level_and_relative_imports() -> None:
    sources = {
        "actorch._actors.host": "from .registry import Registry",
        "actorch._actors.registry": "def f():\n    from actorch._actors import service",
        "actorch._actors.service": "from .. import _actors\nfrom .host import Host",
        "actorch._actors": "",
    }
    assert cycles_of(sources) == [["actorch._actors.host", "actorch._actors.registry", "actorch._actors.service"]]


def test_cycle_check_lists_each_cycle_once_with_its_import_lines() -> None:
    sources = {
        "actorch._engine.a": "from . import b\nfrom . import c",
        "actorch._engine.b": "from . import a",
        "actorch._engine.c": "\nfrom .b import B",
    }
    layout = Layout(frozenset(sources), SAMPLE.packages)
    edges = import_graph(sources, layout)
    cycles = import_cycles(edges)
    assert cycles == [
        ["actorch._engine.a", "actorch._engine.b"],
        ["actorch._engine.a", "actorch._engine.c", "actorch._engine.b"],
    ]
    assert describe_cycles(cycles[:1], edges) == (
        "actorch._engine.a -> actorch._engine.b -> actorch._engine.a\n"
        "    actorch._engine.a:1 imports actorch._engine.b\n"
        "    actorch._engine.b:1 imports actorch._engine.a"
    )


def test_cycle_check_finds_nothing_in_a_layered_package() -> None:
    sources = {
        "actorch._base.errors": "import builtins",
        "actorch._engine.cell": "from actorch._base.errors import ActorchError",
        "actorch._engine.node": "from .cell import Cell\nfrom .._base import errors",
    }
    assert cycles_of(sources) == []


ACTOR_TIE = {
    "actorch._actors.actor": (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from actorch._actors.ref import ActorRef\n"
        "    from actorch._actors.system import ActorSystem\n"
    ),
    "actorch._actors.ref": "from actorch._actors.actor import Actor",
    "actorch._actors.system": "from .actor import Actor\nfrom .ref import ActorRef",
}


def test_cycle_check_allows_the_annotation_only_tie_of_actor_with_ref_and_system() -> None:
    assert cycles_of(ACTOR_TIE) == []


def test_cycle_check_flags_the_tie_of_actor_with_ref_once_it_is_imported_at_run_time() -> None:
    sources = {**ACTOR_TIE, "actorch._actors.actor": "def f():\n    from actorch._actors.ref import ActorRef"}
    assert cycles_of(sources) == [["actorch._actors.actor", "actorch._actors.ref"]]


def test_circles_are_found_with_every_import_counted() -> None:
    sources = {
        **ACTOR_TIE,
        "actorch._actors.host": "from .actor import Actor",
        "actorch._actors.system": "from .actor import Actor\nif TYPE_CHECKING:\n    from .host import ActorHost",
        "actorch._engine.a": "from . import b",
        "actorch._engine.b": "def f():\n    from . import a",
        "actorch._engine.c": "from . import a",
    }
    layout = Layout(frozenset(sources), SAMPLE.packages)
    assert sorted(map(sorted, strongly_connected(import_graph(sources, layout)))) == [
        ["actorch._actors.actor", "actorch._actors.host", "actorch._actors.ref", "actorch._actors.system"],
        ["actorch._engine.a", "actorch._engine.b"],
    ]


def test_cycle_check_allows_no_other_annotation_only_tie() -> None:
    sources = {
        **ACTOR_TIE,
        "actorch._actors.ref": "from .actor import Actor\nif TYPE_CHECKING:\n    from . import system",
    }
    assert cycles_of(sources) == [["actorch._actors.ref", "actorch._actors.system"]]


PUBLIC = frozenset({"Actor", "ActorRef", "ReplayBuffer"})


@pytest.mark.parametrize(
    "source",
    [
        "from actorch._base.codec import Codec",
        "from actorch._base import errors",
        "import actorch._engine.node",
        "import actorch",
        "from .._actors.ref import _REF_CODE",
        "from actorch._actors.ref import ActorRef, _resolve_class",
        "if TYPE_CHECKING:\n    from actorch._engine.node import Node",
        "def f():\n    from actorch._engine.cell import Cell",
    ],
)
def test_public_api_check_flags_a_name_actorch_does_not_export(source: str) -> None:
    assert non_public_imports("actorch._stock.group", source, PUBLIC, SAMPLE)


@pytest.mark.parametrize(
    "source",
    [
        "from actorch._actors.actor import Actor",
        "from actorch._actors.ref import ActorRef",
        "from actorch._stock.replay import _check_capacity",
        "from .replay import ReplayBuffer, _check_capacity",
        "from . import replay",
        "import actorch._stock.replay",
        "import torch\nfrom typing import Any",
    ],
)
def test_public_api_check_allows_exported_names_and_other_stock_modules(source: str) -> None:
    assert non_public_imports("actorch._stock.group", source, PUBLIC, SAMPLE) == []


@pytest.mark.parametrize(
    "source",
    [
        "def f(system):\n    return system._host.pool",
        "def f(system, stop):\n    system._shutdown = stop",
        "def f(world):\n    return world[0]._host",
        "from actorch._actors.ref import _rebuild",
        "from ..._actors.node.node_system import _attach",
    ],
)
def test_private_check_flags_a_launch_module_reaching_into_a_lower_layer(source: str) -> None:
    assert private_reaches("actorch._launch.world.serving", source, frozenset({"_host", "_shutdown"}), SAMPLE)


@pytest.mark.parametrize(
    "source",
    [
        "class C:\n    def f(self):\n        return self._host",
        "def f(system):\n    return system.host",
        "import os\nos._exit(0)",
        "from actorch._launch.world.run import _plan",
    ],
)
def test_private_check_allows_own_attributes_other_names_and_the_same_layer(source: str) -> None:
    assert private_reaches("actorch._launch.world.serving", source, frozenset({"_host", "_shutdown"}), SAMPLE) == []


def test_private_attributes_are_those_set_on_self_or_cls_or_in_a_class_body() -> None:
    source = "class C:\n    _kind = 1\n    _made: int\n    def __init__(self):\n        self._host = self.open = 2"
    assert private_attributes({"m": source}) == {"_kind", "_made", "_host"}


def test_exported_names_are_read_from_the_facade() -> None:
    assert {"Actor", "ActorRef", "ActorSystem", "run"} <= exported_names()


@pytest.mark.parametrize(
    ("module", "expected"),
    [
        ("actorch._actors.where", "where"),
        ("actorch._actors.placement.fit", "placement"),
        ("actorch._actors.node", "node"),
        ("actorch._actors", None),
        ("actorch._engine.node", None),
    ],
)
def test_room_of_an_actors_module_is_its_folder_or_itself(module: str, expected: str | None) -> None:
    assert ACTORS_ROOMS.room_of(module) == expected


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("actorch._actors.placement.fit", "from actorch._actors.node.host import ActorHost"),
        ("actorch._actors.placement.fit", "from ..node import host"),
        ("actorch._actors.placement.fit", "def f():\n    from actorch._actors.relocation.spec import RelocationSpec"),
        (
            "actorch._actors.placement.fit",
            "if TYPE_CHECKING:\n    from actorch._actors.node.service import NodeService",
        ),
        ("actorch._actors.registry", "import actorch._actors.node.service"),
        ("actorch._actors.where", "from actorch._actors.ref import ActorRef"),
        ("actorch._actors.system", "if TYPE_CHECKING:\n    from actorch._actors.placement.fit import refusal"),
        ("actorch._actors.relocation.spec", "from actorch._actors.newroom import thing"),
    ],
)
def test_floor_check_flags_an_import_from_a_higher_room(module: str, source: str) -> None:
    assert ACTORS_ROOMS.upward(module, source, ACTORS_SAMPLE)


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("actorch._actors.placement.fit", "from actorch._actors.where import Where"),
        ("actorch._actors.placement.fit", "from .where_placer import Placer"),
        ("actorch._actors.relocation.spec", "from actorch._actors.placement.fit import refusal"),
        ("actorch._actors.node.host", "def f():\n    from actorch._actors.relocation.spec import RelocationSpec"),
        ("actorch._actors.registry", "from actorch._actors.ref import ActorRef\nfrom .system import ActorSystem"),
        ("actorch._actors.where", "from actorch._base.codec import serializable\nimport torch"),
    ],
)
def test_floor_check_allows_an_import_from_the_same_floor_or_below(module: str, source: str) -> None:
    assert ACTORS_ROOMS.upward(module, source, ACTORS_SAMPLE) == []


def test_floor_check_names_the_line_and_both_floors() -> None:
    source = "import os\n\ndef f():\n    from actorch._actors.node.host import ActorHost\n"
    assert ACTORS_ROOMS.upward("actorch._actors.placement.fit", source, ACTORS_SAMPLE) == [
        "actorch._actors.placement.fit:4 imports actorch._actors.node.host: node (floor 5) is above placement (floor 3)"
    ]


def test_floor_check_flags_an_actors_module_in_no_room() -> None:
    assert ACTORS_ROOMS.upward("actorch._actors.newroom", "import os", ACTORS_SAMPLE) == [
        "actorch._actors.newroom is in no room of ACTORS_FLOORS"
    ]


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("actorch._launch.options.system_options", "from actorch._launch.world.nodes import declared_resources"),
        ("actorch._launch.options.system_options", "from actorch._launch.services.status import StatusServer"),
        ("actorch._launch.options.environment", "def f():\n    from actorch._launch.services import logs"),
        ("actorch._launch.services.logs", "if TYPE_CHECKING:\n    from actorch._launch.world.startup import Plan"),
        ("actorch._launch.world.run", "from actorch._launch.cli.command import parser"),
    ],
)
def test_floor_check_flags_a_launch_module_importing_from_a_higher_room(module: str, source: str) -> None:
    assert LAUNCH_ROOMS.upward(module, source)


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("actorch._launch.cli.command", "from actorch._launch.services.status import READABLE_SCHEMAS"),
        ("actorch._launch.cli.run", "from actorch._launch.options.environment import WORLD_SIZE_ENV"),
        ("actorch._launch.world.run", "from actorch._launch.options.system_options import SystemOptions"),
        ("actorch._launch.services.logs", "from actorch._launch.options.environment import effective_log_level"),
        ("actorch._launch.options.system_options", "from actorch._launch.options.setup import Setup"),
    ],
)
def test_floor_check_allows_a_launch_module_importing_from_its_floor_or_below(module: str, source: str) -> None:
    assert LAUNCH_ROOMS.upward(module, source) == []


@pytest.mark.parametrize(
    "source",
    [
        "def f(host):\n    return host.node.log",
        "def f(host):\n    node = host.node\n    return node.lost",
        "class C:\n    def f(self):\n        self._host.node.departing = True",
        "def f(system):\n    return system.host.node.caller.pending",
        "def f(world):\n    world._hosts[0].node.cut_off()",
        "def f(host):\n    return host._node",
    ],
)
def test_node_check_flags_a_reach_through_another_object(source: str) -> None:
    assert node_reaches("actorch._launch.world.lead", source)


@pytest.mark.parametrize(
    "source",
    [
        "class C:\n    def f(self):\n        return self.node.log",
        "from actorch._engine.node import Node, describe_ranks",
        "import actorch._engine.node",
        "def f(host):\n    return host.lost.get(0), host.log",
        "def f(cell):\n    return cell.label",
    ],
)
def test_node_check_allows_a_module_its_own_node_and_the_host_s_methods(source: str) -> None:
    assert node_reaches("actorch._launch.world.lead", source) == []


FLOORS_DOCSTRING = """Layer 4.

Prose that names ``ref`` is no floor.

2. ``placement/``: which node; ``Where`` is no room.
1. the vocabulary: ``where``,
   ``restart`` and ``spawn_request``.

5. ``node/``
"""


def test_floors_are_read_from_a_numbered_list_of_rooms_in_backticks() -> None:
    assert ACTORS_ROOMS.said(FLOORS_DOCSTRING) == {
        2: frozenset({"placement"}),
        1: frozenset({"where", "restart", "spawn_request"}),
        5: frozenset({"node"}),
    }
