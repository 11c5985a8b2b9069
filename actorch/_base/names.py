"""Actor names: the path-shaped naming rule, glob patterns over names, and how an actor is named in messages."""

from __future__ import annotations

import re
from functools import lru_cache

from actorch._base.errors import InvalidNameError

__all__ = ["MAX_NAME_LENGTH", "NAME_RULE", "actor_label", "check_name", "compile_pattern", "label_class"]

MAX_NAME_LENGTH = 255
"""Longest name accepted, in characters."""

NAME_RULE = (
    "a name is one or more '/'-separated segments of letters, digits, '_', '-' or '.', "
    f"no segment empty, '.' or '..', at most {MAX_NAME_LENGTH} characters in all "
    "(e.g. 'rl/observers/3')"
)

_SEGMENT = r"[A-Za-z0-9_.\-]+"
_NAME = re.compile(rf"{_SEGMENT}(?:/{_SEGMENT})*")
_PATTERN = re.compile(r"[A-Za-z0-9_.\-*?/\[\]!]+")
_LABEL = re.compile(r"actor (?:'[^']*' \((?P<named>[^()]+)\)|(?P<unnamed>[^#\s]+)#\d+) on node \d+")


def check_name(name: object) -> str:
    """Return ``name`` if it follows the naming rule, else raise ``InvalidNameError``."""
    if not isinstance(name, str):
        raise InvalidNameError(f"actor name must be a str, not {type(name).__name__}; {NAME_RULE}")
    if (
        len(name) > MAX_NAME_LENGTH
        or _NAME.fullmatch(name) is None
        or any(segment in (".", "..") for segment in name.split("/"))
    ):
        raise InvalidNameError(f"invalid actor name {name!r}: {NAME_RULE}")
    return name


@lru_cache(maxsize=256)
def compile_pattern(pattern: str) -> re.Pattern[str]:
    """Compile a name glob: ``*`` and ``?`` stay inside one segment, ``**`` spans segments.

    ``[abc]`` and ``[!abc]`` match one character of a set, as in shell globs.
    """
    if not isinstance(pattern, str) or not pattern or _PATTERN.fullmatch(pattern) is None:
        raise InvalidNameError(
            f"invalid name pattern {pattern!r}: use name characters with '*', '**', '?' "
            f"and '[...]' wildcards; {NAME_RULE}"
        )
    out: list[str] = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[":
            end = pattern.find("]", i + 1)
            if end == -1:
                raise InvalidNameError(f"invalid name pattern {pattern!r}: '[' without ']'")
            body = pattern[i + 1 : end]
            negate = body.startswith("!")
            if negate:
                body = body[1:]
            if not body:
                raise InvalidNameError(f"invalid name pattern {pattern!r}: empty '[...]' set")
            body = "".join(char if char == "-" else re.escape(char) for char in body)  # keep ranges
            out.append(f"[^/{body}]" if negate else f"[{body}]")
            i = end
        else:
            out.append(re.escape(char))
        i += 1
    try:
        return re.compile("".join(out))
    except re.error as exc:
        raise InvalidNameError(f"invalid name pattern {pattern!r}: {exc}") from None


def actor_label(name: str | None, class_name: str, actor_id: int, rank: int) -> str:
    """How errors and logs name an actor: ``actor 'rl/agent' (Agent) on node 0``, or by class and id."""
    return f"actor {name!r} ({class_name}) on node {rank}" if name else f"actor {class_name}#{actor_id} on node {rank}"


@lru_cache(maxsize=1024)
def label_class(label: str) -> str:
    """The class name in an ``actor_label``: ``Agent`` for ``actor 'rl/agent' (Agent) on node 0``; else the label."""
    found = _LABEL.fullmatch(label)
    if found is None:
        return label
    return found["named"] or found["unnamed"]
