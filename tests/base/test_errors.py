"""The error tree, ``remote_error`` mixing and how remote errors pickle."""

from __future__ import annotations

import asyncio
import inspect
import pickle
import textwrap
import traceback
from pathlib import Path

import pytest

import actorch
from actorch._base import errors as _errors
from actorch._base.errors import RemoteError, actor_stopped, remote_error


class CustomError(Exception):
    pass


class CodedError(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(f"code {code}")


class Outer:
    class NestedError(Exception):
        pass


class FinalError(Exception):
    """An exception class that refuses subclasses, so it cannot be mixed."""

    def __init_subclass__(cls, **kwargs: object) -> None:
        raise TypeError("FinalError cannot be subclassed")


ERROR_CLASSES = [value for value in map(_errors.__dict__.get, _errors.__all__) if isinstance(value, type)]


def path_of(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__name__)
def test_every_error_class_derives_from_actorch_error(cls: type) -> None:
    assert issubclass(cls, actorch.ActorchError)


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__name__)
def test_every_error_class_is_drawn_in_the_module_docstring(cls: type) -> None:
    assert _errors.__doc__ is not None
    assert cls.__name__ in _errors.__doc__


@pytest.mark.parametrize("cls", [c for c in ERROR_CLASSES if c is not actorch.ActorchError], ids=lambda c: c.__name__)
def test_every_error_class_says_when_it_is_raised(cls: type) -> None:
    assert (cls.__doc__ or "").startswith("Raised when ")


@pytest.mark.parametrize(
    ("cls", "builtin"),
    [
        (actorch.EndpointError, TypeError),
        (actorch.ActorNotFoundError, LookupError),
        (actorch.InvalidNameError, ValueError),
        (actorch.SerializationError, TypeError),
        (actorch.SnapshotError, ValueError),
        (actorch.GroupError, ExceptionGroup),
    ],
)
def test_error_classes_are_also_the_matching_builtin(cls: type, builtin: type) -> None:
    assert issubclass(cls, builtin)


def test_error_classes_are_exported_from_the_package() -> None:
    assert {cls.__name__ for cls in ERROR_CLASSES} <= set(actorch.__all__)


def test_remote_error_keeps_type_name_message_and_traceback() -> None:
    error = remote_error("ValueError", "bad value", "Traceback: line 3")
    assert error.type_name == "ValueError"
    assert error.message == "bad value"
    assert error.remote_traceback == "Traceback: line 3"
    assert str(error) == "bad value"
    assert error.args == ("bad value",)


def test_remote_error_of_a_builtin_is_also_that_builtin() -> None:
    error = remote_error("KeyError", "missing")
    assert isinstance(error, RemoteError)
    assert isinstance(error, KeyError)
    assert str(error) == "missing"


def test_remote_error_of_an_importable_class_is_also_that_class() -> None:
    error = remote_error(path_of(CustomError), "custom")
    assert isinstance(error, RemoteError)
    assert isinstance(error, CustomError)


def test_remote_error_of_a_nested_class_is_also_that_class() -> None:
    error = remote_error(path_of(Outer.NestedError), "nested")
    assert isinstance(error, Outer.NestedError)


def test_remote_error_does_not_call_the_original_init() -> None:
    error = remote_error(path_of(CodedError), "code 7")
    assert isinstance(error, CodedError)
    assert str(error) == "code 7"


def test_remote_error_of_an_unknown_class_is_a_plain_remote_error() -> None:
    error = remote_error("nowhere.to.be.Found", "lost")
    assert type(error) is RemoteError
    assert error.type_name == "nowhere.to.be.Found"


def test_remote_error_of_a_name_that_is_not_an_exception_is_a_plain_remote_error() -> None:
    assert type(remote_error("os.path.join", "not a class")) is RemoteError


def test_remote_error_of_an_unmixable_class_is_a_plain_remote_error() -> None:
    error = remote_error(path_of(FinalError), "final")
    assert type(error) is RemoteError
    assert error.message == "final"


def test_remote_error_reuses_one_mixed_class_per_original() -> None:
    assert type(remote_error("ValueError", "a")) is type(remote_error("ValueError", "b"))


def test_remote_error_repr_shows_type_and_message() -> None:
    assert repr(RemoteError("ValueError", "boom")) == "RemoteError(ValueError: 'boom')"


def test_plain_remote_error_survives_pickling() -> None:
    error = RemoteError("nowhere.Gone", "mensaje — ñ", "tb text")
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is RemoteError
    assert (copy.type_name, copy.message, copy.remote_traceback) == ("nowhere.Gone", "mensaje — ñ", "tb text")


def test_mixed_remote_error_stays_mixed_after_pickling() -> None:
    error = remote_error("ValueError", "bad", "tb text")
    copy = pickle.loads(pickle.dumps(error))
    assert isinstance(copy, RemoteError)
    assert isinstance(copy, ValueError)
    assert (copy.type_name, copy.message, copy.remote_traceback) == ("ValueError", "bad", "tb text")
    assert str(copy) == "bad"


def test_mixed_remote_error_class_prints_under_a_public_name() -> None:
    assert traceback.format_exception_only(remote_error("ValueError", "bad")) == [
        "actorch.RemoteError(ValueError): bad\n"
    ]
    custom = remote_error(path_of(CustomError), "custom")
    assert type(custom).__module__ == "actorch"
    assert type(custom).__qualname__ == f"RemoteError({path_of(CustomError)})"


def test_remote_error_raised_in_shows_the_remote_traceback_in_a_note() -> None:
    text = 'Traceback (most recent call last):\n  File "m.py", line 3, in f\nValueError: bad\n'
    error = remote_error("ValueError", "bad", text, "Raised in 'f' of actor 'a' on node 1, pid 7 on host h")
    assert error.__notes__ == [
        "Raised in 'f' of actor 'a' on node 1, pid 7 on host h:\n"
        '  Traceback (most recent call last):\n    File "m.py", line 3, in f\n  ValueError: bad'
    ]
    assert error.remote_traceback == text, "the attribute keeps the text as it came"
    printed = "".join(traceback.format_exception(error))
    assert printed.index("actorch.RemoteError(ValueError): bad") < printed.index('    File "m.py", line 3')


def test_remote_error_without_a_traceback_has_no_note() -> None:
    assert not hasattr(remote_error("ValueError", "bad", "", "Raised in 'f'"), "__notes__")


def test_remote_error_keeps_its_notes_after_pickling() -> None:
    error = remote_error("ValueError", "bad", "tb text", "Raised in 'f'")
    error.add_note("in member 1")
    copy = pickle.loads(pickle.dumps(error))
    assert isinstance(copy, ValueError)
    assert copy.__notes__ == ["Raised in 'f':\n  tb text", "in member 1"]


def test_kind_of_names_a_remote_error_by_its_original_class() -> None:
    assert _errors.kind_of(remote_error(path_of(CustomError), "custom")) == "CustomError"
    assert _errors.kind_of(RemoteError("nowhere.Gone", "lost")) == "Gone"
    assert _errors.kind_of(KeyError("k")) == "KeyError"
    assert _errors.describe(remote_error("ValueError", "bad")) == "ValueError: bad"


def test_remote_error_can_be_caught_as_the_original_class() -> None:
    with pytest.raises(CustomError, match=r"^from afar$"):
        raise remote_error(path_of(CustomError), "from afar")


def test_remote_error_of_gives_a_remote_error_caught_as_its_original_class_and_none_for_a_local_one() -> None:
    with pytest.raises(ValueError, match="bad") as caught:
        raise remote_error("ValueError", "bad", "remote tb text")
    remote = actorch.remote_error_of(caught.value)
    assert remote is caught.value
    assert (remote.type_name, remote.remote_traceback) == ("ValueError", "remote tb text")
    assert actorch.remote_error_of(ValueError("raised here")) is None
    assert actorch.remote_error_of(RemoteError("nowhere.Gone", "lost")) is not None


def test_group_error_keeps_every_result_and_the_failed_indices() -> None:
    first, second = ValueError("a"), KeyError("b")
    error = actorch.GroupError("2 of 3 failed", [first, second], [10, first, second])
    assert error.results == [10, first, second]
    assert error.failed == [1, 2]
    assert error.exceptions == (first, second)
    assert str(error) == "2 of 3 failed (2 sub-exceptions)"


def test_group_error_can_be_split_with_except_star() -> None:
    caught = []
    try:
        raise actorch.GroupError("failed", [ValueError("a"), KeyError("b")], [])
    except* ValueError as group:
        caught.append(type(group.exceptions[0]))
    except* KeyError as group:
        caught.append(type(group.exceptions[0]))
    assert caught == [ValueError, KeyError]


def test_group_error_split_keeps_the_results() -> None:
    first, second = ValueError("a"), KeyError("b")
    error = actorch.GroupError("failed", [first, second], [first, 5, second])
    matched, rest = error.split(ValueError)
    assert isinstance(matched, actorch.GroupError)
    assert isinstance(rest, actorch.GroupError)
    assert matched.exceptions == (first,)
    assert matched.results == [first, 5, second]
    assert matched.failed == [0]
    assert rest.failed == [2]


ERRORS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "concepts" / "errors.md"


def test_the_errors_page_draws_the_tree_of_the_errors_module_and_describes_every_exported_error() -> None:
    page = ERRORS_PAGE.read_text()
    drawn = page.split("```text\n", 1)[1].split("```", 1)[0]
    docstring = inspect.getdoc(_errors) or ""
    assert textwrap.dedent(docstring.split("The tree::\n\n", 1)[1].split("\n\n", 1)[0]) + "\n" == drawn
    exported = {
        name
        for name in actorch.__all__
        if isinstance(getattr(actorch, name), type) and issubclass(getattr(actorch, name), actorch.ActorchError)
    }
    assert {line.lstrip("│├└─ ").split()[0] for line in drawn.splitlines()} == exported
    for name in exported:
        assert f"[`{name}`][actorch.{name}]" in page, f"the errors page does not describe {name}"


def test_group_error_from_outcomes_names_each_failed_member_with_its_error_and_notes_it() -> None:
    refused, lost = ValueError("bad seed"), actorch.NodeLostError("node 2 was lost")
    outcomes: list[object] = [1, refused, lost, 4]
    error = actorch.GroupError.from_outcomes("calls to 'step'", lambda index: f"member {index}", outcomes)
    assert isinstance(error, actorch.GroupError)
    assert error.message == (
        "2 of 4 calls to 'step' failed: member 1: ValueError: bad seed; member 2: NodeLostError: node 2 was lost"
    )
    assert list(error.exceptions) == [refused, lost]
    assert error.results == outcomes
    assert error.failed == [1, 2]
    assert refused.__notes__ == ["in member 1, one of the calls to 'step'"]


def test_group_error_from_outcomes_is_none_when_nothing_failed_and_keeps_given_results() -> None:
    assert actorch.GroupError.from_outcomes("tells of 'x'", str, [1, None, "ok"]) is None
    failed = ValueError("no")
    error = actorch.GroupError.from_outcomes(
        "calls to 'x' of shards", lambda i: f"shard {i + 3}", [failed], results=[None, None, failed]
    )
    assert error is not None
    assert error.results == [None, None, failed]
    assert error.failed == [2]


def test_group_error_from_outcomes_raises_a_cancellation_as_it_is() -> None:
    with pytest.raises(asyncio.CancelledError):
        actorch.GroupError.from_outcomes("calls to 'x'", str, [ValueError("no"), asyncio.CancelledError()])


def test_actor_stopped_says_what_could_not_be_done_and_to_whom() -> None:
    error = actor_stopped("call 'step'", "actor 'w/1' (Worker) on node 1")
    assert isinstance(error, actorch.ActorStoppedError)
    assert str(error) == "cannot call 'step' of actor 'w/1' (Worker) on node 1: the actor has stopped"
