"""The naming rule (``check_name``) and name globs (``compile_pattern``)."""

from __future__ import annotations

import pytest

from actorch import MAX_NAME_LENGTH, InvalidNameError
from actorch._base.names import NAME_RULE, actor_label, check_name, compile_pattern, label_class


@pytest.mark.parametrize(
    "name",
    ["a", "rl/observers/3", "A-b_c.d", "a.b/..c/d..", "x" * MAX_NAME_LENGTH, "/".join(["s"] * 100)],
)
def test_check_name_returns_a_valid_name(name: str) -> None:
    assert check_name(name) == name


@pytest.mark.parametrize(
    "name",
    ["", "/a", "a/", "a//b", ".", "..", "a/./b", "a/../b", "a b", "a\tb", "café", "a*", "a?", "a[b]", "a:b", "a\\b"],
)
def test_check_name_rejects_a_name_breaking_the_rule(name: str) -> None:
    with pytest.raises(InvalidNameError) as info:
        check_name(name)
    assert NAME_RULE in str(info.value)
    assert repr(name) in str(info.value)


@pytest.mark.parametrize("name", [None, 3, b"bytes", ["a"]])
def test_check_name_rejects_a_name_that_is_not_a_str(name: object) -> None:
    with pytest.raises(InvalidNameError, match="must be a str") as info:
        check_name(name)
    assert NAME_RULE in str(info.value)


def test_check_name_rejects_a_name_longer_than_the_limit() -> None:
    with pytest.raises(InvalidNameError):
        check_name("x" * (MAX_NAME_LENGTH + 1))


def test_name_rule_states_the_length_limit() -> None:
    assert str(MAX_NAME_LENGTH) in NAME_RULE


def test_invalid_name_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="invalid actor name"):
        check_name("a//b")


@pytest.mark.parametrize(
    ("pattern", "matching", "not_matching"),
    [
        ("rl/observers/3", ["rl/observers/3"], ["rl/observers/30", "rl/observers"]),
        ("rl/*", ["rl/a", "rl/", "rl/learner-1"], ["rl/a/b", "rl", "xrl/a"]),
        ("rl/*/x", ["rl/a/x"], ["rl/a/b/x"]),
        ("obs*", ["obs", "obs12"], ["obs/1"]),
        ("rl/**", ["rl/a", "rl/a/b/c"], ["rl", "other/a"]),
        ("**", ["a", "a/b/c"], []),
        ("**/3", ["rl/observers/3", "a/3"], ["rl/observers/4"]),
        ("obs?", ["obs1", "obsx"], ["obs", "obs12", "obs/"]),
        ("a?b", ["a.b", "a-b"], ["a/b", "ab"]),
        ("w[abc]", ["wa", "wc"], ["wd", "w", "wab"]),
        ("w[!abc]", ["wd", "w1"], ["wa", "w/", "w"]),
        ("a.b", ["a.b"], ["axb"]),
    ],
)
def test_compile_pattern_matches_names_like_a_glob(pattern: str, matching: list[str], not_matching: list[str]) -> None:
    regex = compile_pattern(pattern)
    for name in matching:
        assert regex.fullmatch(name), f"{pattern!r} should match {name!r}"
    for name in not_matching:
        assert not regex.fullmatch(name), f"{pattern!r} should not match {name!r}"


def test_compile_pattern_treats_a_dash_in_brackets_as_a_range_like_shell_globs() -> None:
    regex = compile_pattern("obs/[0-3]")
    assert regex.fullmatch("obs/2")
    assert not regex.fullmatch("obs/-")
    assert not regex.fullmatch("obs/7")


@pytest.mark.parametrize("pattern", ["", "a b", "a\n", "é*", "a[bc", "a{b,c}", "a[]"])
def test_compile_pattern_rejects_an_invalid_pattern(pattern: str) -> None:
    with pytest.raises(InvalidNameError, match="invalid name pattern"):
        compile_pattern(pattern)


def test_compile_pattern_rejects_a_pattern_that_is_not_a_str() -> None:
    with pytest.raises(InvalidNameError):
        compile_pattern(7)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["rl/agent", "a", "x.y-z_1/2", None])
def test_label_class_reads_the_class_back_from_an_actor_label(name: str | None) -> None:
    assert label_class(actor_label(name, "Agent", 17, 3)) == "Agent"


def test_label_class_of_something_that_is_not_a_label_is_the_text_itself() -> None:
    assert label_class("actor #5 on node 1") == "actor #5 on node 1"
    assert label_class("service") == "service"
