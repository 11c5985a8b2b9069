"""The ``actorch`` console script: the command line, started without the package's facade.

Importing any module of ``actorch`` runs ``actorch/__init__.py`` first, and
that facade imports every layer, torch included: seconds before ``--help``
could print. So the script puts the ``actorch`` package in place without
running its ``__init__``, and the commands that need nothing more (``--help``,
``status``, ``stop``, bad input) import only the light modules of
``actorch._launch`` (the command's, in ``cli/``, and those it reads beneath
it). The first time anything asks the package itself for a
name (``actorch.Actor``, ``from actorch import run``), as the actor classes
that ``actorch serve`` imports do, the facade runs and the package is whole.
``python -m actorch`` is the same command with the facade run first.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from typing import Any

__all__ = ["main"]


class _Deferred(types.ModuleType):
    """The ``actorch`` package whose ``__init__`` has not run yet: it runs it when a name is asked of it."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name != "__all__":
            raise AttributeError(name)  # probes of module attributes (``__version__``...) need no facade
        _run_facade(self)
        try:
            return self.__dict__[name]
        except KeyError:
            raise AttributeError(f"module 'actorch' has no attribute {name!r}") from None


def _run_facade(package: types.ModuleType) -> None:
    """Make ``package`` a plain module again and run its ``__init__`` in it: the whole facade, torch included."""
    package.__class__ = types.ModuleType
    spec = package.__spec__
    assert spec is not None
    assert spec.loader is not None
    spec.loader.exec_module(package)


def main(argv: list[str] | None = None) -> int:
    """Run the ``actorch`` command with ``argv`` (default: the process's), the facade deferred; its exit code."""
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # as the facade does, before a command imports torch
    if "actorch" not in sys.modules:
        spec = importlib.util.find_spec("actorch")
        assert spec is not None
        package = importlib.util.module_from_spec(spec)
        package.__class__ = _Deferred
        sys.modules["actorch"] = package
    from actorch._launch.cli.command import main as command  # noqa: PLC0415 - only once the package is in place

    return command(argv)


if __name__ == "__main__":
    sys.exit(main())
