"""Every Python block of README.md and docs/ runs here, or says why it cannot.

Sybil finds the blocks. Each page runs as a module of its own
(``actorch_docs_<page>``, so that actor classes defined in a block can be
spawned), in a temporary folder: its blocks run in order, sharing one
namespace, on one event loop where top-level ``await`` works. The namespace
starts with ``system``, rank 0 of an in-process world of three nodes
(``actorch.testing.local_world``), and ``world``, that world. Within a block:

- ``actorch.run(main, ...)`` runs ``main`` in an in-process world of
  ``world_size`` nodes (the arguments are checked against the real ``run``'s
  signature), and ``if __name__ == "__main__":`` holds, as in a script;
- a ``main`` that the block defines and does not run is run on ``system``
  after it, and ``test_*`` functions that it defines are called, as pytest
  would;
- ``--8<-- "path"`` (mkdocs' snippet include) runs the file it includes.

In the Markdown, each of these goes on its own line:

- ``<!-- skip: next "needs torchrun" -->`` before a block that cannot run
  here; the reason is required. A reason reading ``"an excerpt of
  examples/foo.py"`` (or ``foo.ipynb``) also checks that the block's code
  lines are lines of that file (of its code cells).
- ``<!-- run-as-script -->`` before a whole program that needs real
  processes: it runs as ``python <page>.py`` and must exit with 0.
- ``<!-- invisible-code-block: python``, code, ``-->``: set-up that readers
  need not see.

docs/architecture.md ("Tests of the documentation") says the same for
contributors.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import dataclasses
import importlib
import inspect
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import types
import unittest
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from sybil import Document, Example, Region, Sybil
from sybil.evaluators.python import pad
from sybil.parsers.markdown import CodeBlockParser, SkipParser
from sybil.parsers.markdown.lexers import DirectiveInHTMLCommentLexer

import actorch
from actorch._base import codec
from actorch._launch.options.system_options import IN_PROCESS, options_of
from actorch.testing import local_world

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
WORLD_SIZE = 3
"""Nodes of each page's world (``system`` is its rank 0)."""

REAL_RUN = actorch.run
RUN_SIGNATURE = inspect.signature(REAL_RUN)
SNIPPET = re.compile(r'\A\s*--8<--\s+"([^"]+)"\s*\Z')
SCRIPT_TIMEOUT = 120.0
"""Seconds a block run as a script may take, worker processes included."""
EXCERPT = re.compile(r"excerpt of (\S+\.(?:py|ipynb))\b")
FENCE = re.compile(r"^[ \t]*(?:[-*+][ \t]+)?(`{3,}|~{3,})[ \t]*([^\s`]*)[^\n]*$", re.MULTILINE)


class ReasonedSkipParser(SkipParser):
    """Sybil's ``skip`` directive, but ``skip: next`` and ``skip: start`` must say why."""

    def __call__(self, document: Document) -> Iterator[Region]:
        for region in super().__call__(document):
            action, reason = region.parsed
            if action in ("next", "start") and not (reason and reason.strip().strip("\"'")):
                line = document.line_column(region.start)
                raise ValueError(f'{document.path}, {line}: write the reason, as in <!-- skip: {action} "why" -->')
            yield region


class ScriptParser:
    """``<!-- run-as-script -->``: the next block is a whole program, run as ``python block.py``."""

    MARK = "run-as-script"

    def __init__(self) -> None:
        self.lexer = DirectiveInHTMLCommentLexer(self.MARK, arguments="")

    def __call__(self, document: Document) -> Iterator[Region]:
        for lexed in self.lexer(document):
            yield Region(lexed.start, lexed.end, self.MARK, _evaluator)


@dataclass
class Page:
    """One Markdown page: its module, its event loop and its world, open while its blocks run."""

    path: Path
    document: Document
    module: types.ModuleType
    examples: list[Example] = field(default_factory=list)
    scripts: set[int] = field(default_factory=set)
    runner: asyncio.Runner | None = None
    stack: contextlib.AsyncExitStack | None = None
    ran: set[Any] = field(default_factory=set)
    saved_torch: tuple[int, torch.Tensor] | None = None
    saved_cwd: str | None = None
    folder: tempfile.TemporaryDirectory[str] | None = None

    @property
    def name(self) -> str:
        return str(self.path.relative_to(ROOT))

    def open(self) -> None:
        self.saved_torch = (torch.get_num_threads(), torch.random.get_rng_state())
        self.folder = tempfile.TemporaryDirectory(prefix="actorch-docs-")
        self.saved_cwd = os.getcwd()
        os.chdir(self.folder.name)  # files a block writes land there
        sys.modules[self.module.__name__] = self.module
        self.runner = asyncio.Runner()
        self.stack = contextlib.AsyncExitStack()
        world = self.runner.run(self.stack.enter_async_context(local_world(WORLD_SIZE)))
        self.module.__dict__.update(world=world, system=world[0])

    def close(self) -> None:
        try:
            if self.runner is not None and self.stack is not None:
                self.runner.run(self.stack.aclose())
        finally:
            if self.runner is not None:
                self.runner.close()
            name = self.module.__name__
            sys.modules.pop(name, None)
            self.module.__dict__.clear()
            for code, cls in list(codec._serializable_classes.items()):  # the page's @serializable classes
                if cls.__module__ == name:
                    codec._serializable_classes.pop(code)
                    codec._decoders.pop(code, None)
                    codec._encoders.pop(cls, None)
            if self.saved_cwd is not None:
                os.chdir(self.saved_cwd)
            if self.folder is not None:
                self.folder.cleanup()
            if self.saved_torch is not None:
                threads, rng = self.saved_torch
                torch.set_num_threads(threads)
                torch.random.set_rng_state(rng)

    def run(self, coroutine: Any) -> Any:
        assert self.runner is not None, f"{self.name} is not open"
        return self.runner.run(coroutine)

    def fake_run(self, main: Any, world_size: int | None = None, **options: Any) -> Any:
        """``actorch.run`` for a doc block: ``main`` in an in-process world of ``world_size`` nodes."""
        RUN_SIGNATURE.bind(main, world_size, **options)
        given = options.pop("options", None)
        chosen = options_of("run", given, options)  # a misspelt or bad option fails here, as in run
        if chosen.elastic:
            raise RuntimeError("an elastic system needs processes: mark this block skipped, saying so")
        setup = chosen.setup
        kwargs = {key: getattr(chosen, key) for key in IN_PROCESS if key in options or given is not None}

        async def in_world() -> Any:
            async with local_world(world_size or 1, **kwargs) as world:
                if setup is not None:
                    for rank in range(len(world)):
                        result = setup(rank)
                        if inspect.isawaitable(result):
                            await result
                return await main(world[0])

        self.ran.add(main)
        return self.run(in_world())

    def evaluate(self, example: Example) -> None:
        """Run one block in the page's namespace (the evaluator of every Python block)."""
        __tracebackhide__ = True
        source = str(example.parsed)
        line = example.line + example.parsed.line_offset
        included = SNIPPET.match(source)
        if included is not None:
            filename, source, line = str(ROOT / included[1]), (ROOT / included[1]).read_text(), 0
        else:
            filename = example.path
        if example.start in self.scripts:
            self.run_script(pad(source, line))
            return
        tree = ast.parse(pad(source, line), filename)
        tree.body = [_as_script(statement) for statement in tree.body]
        code = compile(tree, filename, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
        namespace = self.module.__dict__
        before = dict(namespace)
        with _patched(actorch, "run", self.fake_run):
            if code.co_flags & inspect.CO_COROUTINE:
                self.run(eval(code, namespace))
            else:
                exec(code, namespace)
            self._run_defined(namespace, before)

    def run_script(self, source: str) -> None:
        """Run a whole program as ``python <page>.py`` (its workers import it), and check that it exits 0."""
        assert self.folder is not None, f"{self.name} is not open"
        script = Path(self.folder.name) / f"{self.path.stem.replace('-', '_')}.py"
        script.write_text(source)
        done = subprocess.run(
            [sys.executable, str(script)],
            cwd=self.folder.name,
            capture_output=True,
            text=True,
            timeout=SCRIPT_TIMEOUT,
            check=False,
        )
        assert done.returncode == 0, (
            f"{self.name}: the block run as a script exited with {done.returncode}\n"
            f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
        )

    def _run_defined(self, namespace: dict[str, Any], before: dict[str, Any]) -> None:
        """Run the ``main`` and ``test_*`` functions the block defined and did not run itself."""
        for name, value in list(namespace.items()):
            if before.get(name) is value or not inspect.isfunction(value) or value in self.ran:
                continue
            if name == "main" and inspect.iscoroutinefunction(value):
                self.ran.add(value)
                self.run(value(namespace["system"]))
            elif name.startswith("test_"):
                self.ran.add(value)
                result = value()
                if inspect.iscoroutine(result):
                    self.run(result)


def _as_script(statement: ast.stmt) -> ast.stmt:
    """``if __name__ == "__main__":`` holds, as when the block is run as a script."""
    if (
        isinstance(statement, ast.If)
        and isinstance(statement.test, ast.Compare)
        and isinstance(statement.test.left, ast.Name)
        and statement.test.left.id == "__name__"
        and len(statement.test.comparators) == 1
        and isinstance(statement.test.comparators[0], ast.Constant)
        and statement.test.comparators[0].value == "__main__"
    ):
        statement.test = ast.copy_location(ast.Constant(value=True), statement.test)
    return statement


@contextlib.contextmanager
def _patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    saved = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, saved)


def _evaluator(example: Example) -> None:
    __tracebackhide__ = True
    BY_DOCUMENT[id(example.document)].evaluate(example)


SYBIL = Sybil(
    parsers=[CodeBlockParser("python", _evaluator), ReasonedSkipParser(), ScriptParser()],
    path=str(ROOT),
)
BY_DOCUMENT: dict[int, Page] = {}


def _load(path: Path) -> Page:
    document = SYBIL.parse(path)
    slug = re.sub(r"\W", "_", str(path.relative_to(ROOT).with_suffix("")))
    page = Page(path, document, types.ModuleType(f"actorch_docs_{slug}"))
    document.namespace = page.module.__dict__
    marked = False
    for example in document.examples():
        if example.parsed == ScriptParser.MARK:
            marked = True
            continue
        if marked and example.region.evaluator is _evaluator:
            page.scripts.add(example.start)
            marked = False
        page.examples.append(example)
    BY_DOCUMENT[id(document)] = page
    return page


LOADED = [_load(path) for path in PAGES]
BLOCKS = [(page, index) for page in LOADED for index in range(len(page.examples))]


@pytest.fixture(scope="module")
def open_pages() -> Iterator[dict[Path, Page]]:
    opened: dict[Path, Page] = {}
    yield opened
    for page in opened.values():
        page.close()


@pytest.mark.parametrize(
    ("page", "index"), BLOCKS, ids=[f"{page.name}:{page.examples[index].line}" for page, index in BLOCKS]
)
def test_block(page: Page, index: int, open_pages: dict[Path, Page]) -> None:
    if page.path not in open_pages:
        page.open()
        open_pages[page.path] = page
    example = page.examples[index]
    try:
        example.evaluate()
    except unittest.SkipTest as skipped:  # <!-- skip: next "reason" -->: say where, and why
        pytest.skip(f"{page.name}, line {example.line}: {skipped}")
    finally:
        if index == len(page.examples) - 1:
            open_pages.pop(page.path).close()


@pytest.mark.parametrize("page", LOADED, ids=[page.name for page in LOADED])
def test_every_python_block_is_run_or_skipped(page: Page) -> None:
    """Each fence names its language, and each Python fence is one Sybil runs (or skips, saying why)."""
    text = page.document.text
    starts = {example.start for example in page.examples}
    opening = True
    for match in FENCE.finditer(text):
        if not opening:
            opening = True
            continue
        opening = False
        language = match[2]
        where = f"{page.name}, {page.document.line_column(match.start())}"
        assert language, f"{where}: a code block without a language (write ```python, ```bash, ```text...)"
        if language.lower() in ("py", "python", "python3", "pycon"):
            assert language == "python", f"{where}: write ```python, which the doc tests run"
            assert match.start() in starts, f"{where}: a Python block the doc tests do not see"
    regions = [region for _, region in page.document.regions]
    for region, following in zip(regions, [*regions[1:], None], strict=False):
        skip_next = isinstance(region.parsed, tuple) and region.parsed[0] == "next"
        if skip_next or region.parsed == ScriptParser.MARK:
            where = f"{page.name}, {page.document.line_column(region.start)}"
            assert following is not None, f"{where}: no Python block follows"
            assert following.evaluator is _evaluator, f"{where}: no Python block follows"
            between = re.sub(r"\A\s*--+>", "", text[region.end : following.start])  # a one-line directive's end
            assert not between.strip(), (
                f"{where}: put the directive right before its block, not {between.strip()[:40]!r}"
            )


def _code_lines(source: str) -> list[str]:
    """The lines of a block that hold code, without comments, indentation and "actorch." ("..." left out)."""
    lines = (line.split("  #")[0].split(" # ")[0].strip().replace("actorch.", "") for line in source.splitlines())
    return [line for line in lines if line and not line.startswith("#") and line != "..."]


def _source_text(path: Path) -> str:
    """A file's text; a notebook's is the source of its code cells."""
    if path.suffix != ".ipynb":
        return path.read_text()
    cells = json.loads(path.read_text())["cells"]
    return "\n".join("".join(cell["source"]) for cell in cells if cell["cell_type"] == "code")


@pytest.mark.parametrize("page", LOADED, ids=[page.name for page in LOADED])
def test_excerpts_match_their_source(page: Page) -> None:
    """A block skipped as "an excerpt of path.py" holds only lines of that file (comments aside)."""
    examples = page.examples
    for skip, block in itertools.pairwise(examples):
        if not isinstance(skip.parsed, tuple) or skip.parsed[0] != "next":
            continue
        found = EXCERPT.search(skip.parsed[1] or "")
        if found is None:
            continue
        source = ROOT / found[1]
        assert source.is_file(), f"{page.name}, line {skip.line}: {found[1]} does not exist"
        known = set(_code_lines(_source_text(source)))
        missing = [line for line in _code_lines(str(block.parsed)) if line not in known]
        assert not missing, f"{page.name}, line {block.line}: not in {found[1]}: {missing}"


# ---------------------------------------------------------------------- architecture.md's "where to change what"

TABLE_HEADING = "## Where to change what"
BACKTICKED = re.compile(r"`([^`]+)`")
PLAIN_DOC = re.compile(r"(?<![\w/`])((?:docs|examples|benchmarks|tests)/[\w./-]*)")
TOP_FOLDERS = ("actorch/", "docs/", "tests/", "examples/", "benchmarks/")


def _change_table(page: str) -> list[str]:
    """The rows of the "where to change what" table of ``page`` (architecture.md's text)."""
    section = page.split(TABLE_HEADING, 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| to change")]


def _path_of(token: str) -> Path | None:
    """The file or folder a table token names, or None if it names none (a class, an option...).

    ``_actors/node/host.py`` is under ``actorch/``; ``docs/cli.md``, ``tests/...``
    and ``actorch/...`` are under the repository's root.
    """
    if not re.fullmatch(r"[\w./-]+(?:\.py|\.md|/)", token):
        return None
    return ROOT / token if token.startswith(TOP_FOLDERS) else ROOT / "actorch" / token


def _module_missing(dotted: str) -> str | None:
    """Why ``dotted`` (``actorch.x.y``, maybe ending in an attribute) names nothing; None if it names something."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:cut])
        if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
            module = importlib.import_module(".".join(parts[:cut]))
            rest = parts[cut:]
            if len(rest) > 1 or (rest and not hasattr(module, rest[0])):
                return f"{dotted}: {'.'.join(parts[:cut])} has no {'.'.join(rest)}"
            return None
    return f"{dotted}: no such module"


def missing_in_change_table(page: str) -> list[str]:
    """What the table names that does not exist: paths (backticked or docs/...), and ``actorch.`` modules."""
    missing = []
    for row in _change_table(page):
        for token in BACKTICKED.findall(row):
            path = _path_of(token)
            if path is not None and not path.exists():
                missing.append(f"{token} ({path.relative_to(ROOT)})")
            for dotted in re.findall(r"\bactorch(?:\.\w+)+", token):
                why = _module_missing(dotted)
                if why is not None:
                    missing.append(why)
        for plain in PLAIN_DOC.findall(BACKTICKED.sub("", row)):
            if not (ROOT / plain.rstrip(".")).exists():
                missing.append(plain)
    return missing


_NAME = r"[A-Za-z_]\w*(?:\.\w+)?"
_PY = r"[\w./-]+\.py"
PLACED = (
    (re.compile(rf"`({_NAME})` in `({_PY})`"), 1, 2),  # `Placer` in `_actors/placement/where_placer.py`
    (re.compile(rf"`({_NAME})` \(`({_PY})`"), 1, 2),  # `OWN_CODES` (`_base/codec.py`)
    (re.compile(rf"`({_PY})`'s `({_NAME})`"), 2, 1),  # `_base/codec.py`'s `OWN_CODES`
    (re.compile(rf"`({_PY})` \(`({_NAME})`"), 2, 1),  # `_engine/metrics.py` (`Metrics`, ...)
)
"""How a row of the table puts a name in a module: the pattern, and the groups of the name and of the path."""


def defined_in(path: Path) -> frozenset[str]:
    """What ``path`` defines: its top-level names, and each member of its classes as ``Class.member`` and alone.

    A member is a name bound in the class's body, an attribute its methods set
    on ``self``, or one of its ``__slots__``.
    """
    found: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef):
            found.add(node.name)
            members: set[str] = set()
            for statement in node.body:
                members |= _bound(statement)
                if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
                    members |= {
                        target.attr
                        for inner in ast.walk(statement)
                        if isinstance(inner, ast.Assign | ast.AnnAssign)
                        for target in (inner.targets if isinstance(inner, ast.Assign) else [inner.target])
                        if isinstance(target, ast.Attribute)
                        and isinstance(target.value, ast.Name)
                        and target.value.id == "self"
                    }
                if isinstance(statement, ast.Assign) and "__slots__" in _bound(statement):
                    members |= {slot.value for slot in ast.walk(statement.value) if isinstance(slot, ast.Constant)}
            found |= members | {f"{node.name}.{member}" for member in members}
        else:
            found |= _bound(node)
    return frozenset(found)


def _bound(statement: ast.stmt) -> set[str]:
    """The names a statement of a module's or a class's body binds (a def, a class, an assignment)."""
    if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {statement.name}
    targets = statement.targets if isinstance(statement, ast.Assign) else []
    if isinstance(statement, ast.AnnAssign):
        targets = [statement.target]
    return {name.id for target in targets for name in ast.walk(target) if isinstance(name, ast.Name)}


def placed_in_change_table(page: str) -> list[tuple[str, str]]:
    """The names the table puts in a module (```X` in `path.py```, ```path.py`'s `X```...), with the module's token."""
    placed = []
    for row in _change_table(page):
        for pattern, name_group, path_group in PLACED:
            placed += [(found[name_group], found[path_group]) for found in pattern.finditer(row)]
    return [(name, token) for name, token in placed if not name.startswith("actorch.")]  # public names: the facade's


def misplaced_in_change_table(page: str) -> list[str]:
    """The names the table puts in a module that the module does not define."""
    misplaced = []
    for name, token in placed_in_change_table(page):
        path = _path_of(token)
        if path is not None and path.is_file() and name not in defined_in(path):  # a missing file: the check below
            misplaced.append(f"{name} is not defined in {token}")
    return misplaced


def test_change_table_puts_each_name_in_the_module_that_defines_it() -> None:
    page = (ROOT / "docs" / "architecture.md").read_text()
    assert len(placed_in_change_table(page)) >= 40
    assert misplaced_in_change_table(page) == []


def test_change_table_check_finds_a_name_where_the_module_does_not_define_it() -> None:
    page = (
        f"{TABLE_HEADING}\n\n| to change | look at |\n|---|---|\n"
        "| a | `Placer` in `_actors/placement/where_placer.py`, `Placer` in `_actors/placement/fit.py`; "
        "`OWN_CODES` (`_base/codec.py`), `_base/codec.py`'s `Codec.drop`, `_base/codec.py`'s `Codec.nowhere` |\n"
        "| b | `_engine/node.py` (`start_trace` and `stop_trace`), `_engine/node.py` (`Node.nowhere`), "
        "`run(trace=)` in `_launch/world/lead.py` |\n"
    )
    assert misplaced_in_change_table(page) == [
        "Placer is not defined in _actors/placement/fit.py",
        "Codec.nowhere is not defined in _base/codec.py",
        "Node.nowhere is not defined in _engine/node.py",
    ]


def test_change_table_names_only_paths_and_modules_that_exist() -> None:
    page = (ROOT / "docs" / "architecture.md").read_text()
    assert len(_change_table(page)) >= 30
    assert missing_in_change_table(page) == []


def test_change_table_check_finds_a_path_or_module_that_does_not_exist() -> None:
    page = (
        f"{TABLE_HEADING}\n\n| to change | look at |\n|---|---|\n"
        "| a | `_actors/node/host.py`, `_actors/placing.py`, `actorch._launch.cli.reference`, "
        "`actorch._actors.nowhere`, `actorch.__all__`, `actorch.no_such_name` |\n"
        "| b | docs/operations.md's table, then docs/guides/nowhere.md |\n\n## Next\n\n| `_gone.py` |\n"
    )
    assert missing_in_change_table(page) == [
        "_actors/placing.py (actorch/_actors/placing.py)",
        "actorch._actors.nowhere: actorch._actors has no nowhere",
        "actorch.no_such_name: actorch has no no_such_name",
        "docs/guides/nowhere.md",
    ]


def test_the_rl_guide_names_every_field_a_batch_carries() -> None:
    from actorch.rl import Batch  # noqa: PLC0415 - the stock actors' module, here only

    guide = (ROOT / "docs" / "guides" / "reinforcement-learning.md").read_text()
    fields = [each.name for each in dataclasses.fields(Batch) if each.name != "slot"]  # a reader never sees it set
    assert len(fields) == 11
    assert [name for name in fields if f"`{name}`" not in guide] == []
