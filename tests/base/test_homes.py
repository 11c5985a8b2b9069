"""``claim``: a public module becomes the home of the classes and functions it exports from private modules."""

from __future__ import annotations

import types

from actorch._base.homes import claim


def made_in(module: str) -> tuple[type, types.FunctionType, object]:
    """A class, a function and a plain object, each defined in ``module``."""
    cls = type("Thing", (), {"__module__": module})

    def function() -> None: ...

    function.__module__ = module
    return cls, function, object()


def test_claim_rehomes_classes_and_functions_of_private_modules() -> None:
    cls, function, _ = made_in("actorch._stock.things")
    claim("actorch.things", ["Thing", "function"], {"Thing": cls, "function": function})
    assert (cls.__module__, function.__module__) == ("actorch.things", "actorch.things")


def test_claim_leaves_objects_a_public_module_claimed_first() -> None:
    cls, function, _ = made_in("actorch.rl")
    claim("actorch", ["Thing", "function"], {"Thing": cls, "function": function})
    assert (cls.__module__, function.__module__) == ("actorch.rl", "actorch.rl")


def test_claim_leaves_names_outside_all_and_plain_objects() -> None:
    cls, _, instance = made_in("actorch._stock.things")
    claim("actorch.things", ["instance"], {"Thing": cls, "instance": instance})
    assert cls.__module__ == "actorch._stock.things"
    assert not hasattr(instance, "__module__") or type(instance).__module__ == "builtins"
