"""The tables ``actorch status`` prints: one row per node, one row per actor (rates between two refreshes).

Since schema 3 they also show each node's event loop (its lag, or that it is
blocked), each actor's running handlers (the oldest's age), the age of its
oldest queued message and what its handlers wait on, and the cycles of
handlers waiting on each other, named.
"""

from __future__ import annotations

from typing import Any

__all__ = ["status_tables"]


def status_tables(current: dict[str, Any], previous: dict[str, Any] | None) -> list[Any]:
    """The nodes table and the actors table of one status (rates against ``previous``, else since start)."""
    from rich.table import Table  # noqa: PLC0415 - only this command needs rich

    elapsed = current["time"] - previous["time"] if previous is not None else None
    before = {node["rank"]: node for node in previous["nodes"]} if previous is not None else {}
    nodes = Table(title=f"nodes ({current['world_size']})", title_justify="left")
    for column in (
        "rank",
        "host",
        "pid",
        "devices",
        "label",
        "resources free",
        "state",
        "loop",
        "actors",
        "msgs/s in",
        "msgs/s out",
    ):
        nodes.add_column(column, justify="right" if column.startswith(("rank", "pid", "actors", "msgs")) else "left")
    actors = Table(title="actors", title_justify="left")
    for column in (
        "actor",
        "class",
        "node",
        "running",
        "waits on",
        "queued",
        "queued for",
        "handled",
        "errors",
        "p50",
        "p99",
        "calls/s",
    ):
        actors.add_column(column, justify="left" if column in ("actor", "class", "running", "waits on") else "right")
    for node in current["nodes"]:
        rank = node["rank"]
        if "statistics" not in node:
            state = f"lost: {node['lost']}" if "lost" in node else "not answering"
            loop = _loop(node["loop"]) if "loop" in node else ""
            nodes.add_row(str(rank), "", "", "", "", "", state, loop, "", "", "")
            continue
        stats, old = node["statistics"], before.get(rank, {}).get("statistics")
        span = elapsed if old is not None and elapsed else node["uptime"]
        incoming = _in(stats) - (_in(old) if old else 0)
        outgoing = _out(stats) - (_out(old) if old else 0)
        nodes.add_row(
            str(rank),
            node["host"],
            str(node["pid"]),
            ", ".join(node["devices"]) or "-",
            _label(node),
            _resources(node),
            "alive",
            _loop(node["loop"]) if "loop" in node else "-",
            str(len(node["actors"])),
            _rate(incoming, span),
            _rate(outgoing, span),
        )
        old_actors = {actor["id"]: actor for actor in before.get(rank, {}).get("actors", [])}
        for actor in node["actors"]:
            endpoints = actor["endpoints"].values()
            calls = actor["handled"]
            errors = sum(endpoint["errors"] for endpoint in endpoints)
            was = old_actors.get(actor["id"])
            done = calls - was["handled"] if was is not None else calls
            actors.add_row(
                actor["name"] or f"#{actor['id']}",
                actor["class"],
                str(rank),
                _handlers(actor.get("handlers")),
                _waits(actor.get("handlers")),
                str(actor["queued"]),
                _duration(actor.get("queued_seconds")),
                str(calls),
                str(errors),
                _worst(endpoints, "p50"),
                _worst(endpoints, "p99"),
                _rate(done, span),
            )
    tables = [nodes, actors]
    cycles = current.get("wait_cycles")
    if cycles:
        waits = Table(title="waiting in a cycle (deadlocked unless a deadline ends it)", title_justify="left")
        waits.add_column("cycle")
        for cycle in cycles:
            waits.add_row(" -> ".join([*cycle, cycle[0]]))
        tables.append(waits)
    return tables


def _loop(loop: dict[str, Any]) -> str:
    """A node's event loop: its lag now and at worst in the last minute, or how long it has been blocked."""
    if not loop["responsive"]:
        return f"BLOCKED {loop['behind']:.1f} s"
    return f"lag {_duration(loop['lag'])} (max {_duration(loop['lag_max'])})"


def _handlers(running: list[dict[str, Any]] | None) -> str:
    """An actor's running handlers: the endpoints (oldest first) and how long the oldest has run; ``-`` if none."""
    if running is None:
        return "-"
    if not running:
        return "idle"
    names = ", ".join(dict.fromkeys(handler["endpoint"] for handler in running))
    return f"{names} ({_duration(running[0]['seconds'])})"


def _waits(running: list[dict[str, Any]] | None) -> str:
    """The actors an actor's running handlers wait on."""
    return ", ".join(sorted({label for handler in running or () for label in handler.get("waits_on", ())})) or "-"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.1f} s"


def _label(node: dict[str, Any]) -> str:
    """A node's label, and whose own process it is or which node started it (schema 2)."""
    parts = [node["label"] or ""]
    if node.get("owner"):
        parts.append(f"(own process of {node['owner']})")
    elif node.get("parent") is not None:
        parts.append(f"(started by node {node['parent']})")
    if node.get("pool"):
        parts.append("(host agent)")
    return " ".join(part for part in parts if part)


def _resources(node: dict[str, Any]) -> str:
    """What a node has free of what it has: ``cpus 1/2, env_slots 3/4`` (memory in GiB); ``-`` before schema 2."""
    have: dict[str, float] = node.get("resources") or {}
    free: dict[str, float] = node.get("free") or {}
    shown = []
    for name, amount in sorted(have.items()):
        left = free.get(name, amount)
        if name == "memory":
            shown.append(f"memory {left / 2**30:.3g}/{amount / 2**30:.3g} GiB")
        elif amount:
            shown.append(f"{name} {left:g}/{amount:g}")
    return ", ".join(shown) or "-"


def _in(stats: dict[str, int]) -> int:
    return stats["calls_received"] + stats["tells_received"]


def _out(stats: dict[str, int]) -> int:
    return stats["calls_sent"] + stats["tells_sent"]


def _rate(count: float, seconds: float) -> str:
    return f"{count / seconds:,.1f}" if seconds > 0 else "-"


def _worst(endpoints: Any, key: str) -> str:
    """The largest of the endpoints' ``key`` quantile, as a duration (an actor's slowest endpoint rules)."""
    found = [endpoint[key] for endpoint in endpoints if endpoint[key] is not None]
    if not found:
        return "-"
    seconds = max(found)
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"
