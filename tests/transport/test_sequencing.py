"""Link order: bundles that come out of order are held until their turn, within a budget, on every link apart."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from actorch._transport import sequencing
from actorch._transport.sequencing import LinkOrder


def _order() -> tuple[LinkOrder[bytes], list[tuple[int, bytes]]]:
    delivered: list[tuple[int, bytes]] = []
    order: LinkOrder[bytes] = LinkOrder(lambda src, payload: delivered.append((src, payload)), len)
    order.meet(1)
    order.meet(2)
    return order, delivered


def test_link_order_delivers_bundles_in_sequence_whatever_order_they_come_in() -> None:
    order, delivered = _order()
    assert order.arrived(1, 2, b"c") is None
    assert order.arrived(1, 1, b"b") is None
    assert delivered == []
    assert order.held_bytes[1] == 2
    assert order.arrived(1, 0, b"a") is None
    assert delivered == [(1, b"a"), (1, b"b"), (1, b"c")]
    assert order.held[1] == {}
    assert order.held_bytes[1] == 0
    assert order.expected[1] == 3


def test_link_order_keeps_each_link_apart() -> None:
    order, delivered = _order()
    order.arrived(1, 1, b"one late")
    order.arrived(2, 0, b"two first")
    assert delivered == [(2, b"two first")]
    assert order.expected == {1: 0, 2: 1}


def test_link_order_meeting_a_peer_again_keeps_its_link_as_it_is() -> None:
    order, _ = _order()
    order.next_seq[1] = 5
    order.arrived(1, 0, b"a")
    order.meet(1)
    assert (order.next_seq[1], order.expected[1]) == (5, 1)


def test_link_order_refuses_to_hold_past_the_budget_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sequencing, "HELD_BUDGET", 250)
    order, delivered = _order()
    assert order.arrived(1, 1, b"b" * 100) is None
    assert order.arrived(1, 2, b"c" * 100) is None
    assert order.arrived(1, 3, b"d" * 100) == "300 bytes of bundles waited for bundle 0, which never came"
    assert sorted(order.held[1]) == [1, 2]  # the refused one is neither held nor delivered
    assert delivered == []


def test_link_order_gives_back_what_it_held_for_a_peer_lost_or_gone() -> None:
    order, _ = _order()
    order.arrived(1, 3, b"x")
    order.arrived(2, 5, b"y")
    assert order.drop_held(1) == [b"x"]
    assert order.held[1] == {}
    assert 1 not in order.held_bytes
    assert order.forget(2) == [b"y"]
    assert 2 not in order.held
    assert order.forget(2) == []  # twice is once


def test_link_order_imports_neither_torch_nor_sockets() -> None:
    tree = ast.parse(Path(sequencing.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not {name for name in imported if name.split(".")[0] in ("torch", "socket", "asyncio")}, imported
