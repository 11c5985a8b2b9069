"""The ids of the runtime's own actors, in one table: each node's service, rank 0's registry and relocator.

The engine keeps the ids up to ``SYSTEM_IDS`` for them: a spawned actor never
gets one, and flow control never holds their messages back. The actor layer
hosts its service, registry and relocator under these ids and reaches them by
them on any node.
"""

from __future__ import annotations

__all__ = ["REGISTRY_ID", "RELOCATOR_ID", "SERVICE_ID", "SYSTEM_IDS"]

SERVICE_ID = 1
"""Every node's ``NodeService``: builds, stops and watches the node's actors, takes part in leaving and shutdown."""

REGISTRY_ID = 2
"""Rank 0's ``Registry`` of names."""

RELOCATOR_ID = 3
"""Rank 0's ``Relocator``: keeps relocatable actors' snapshots and moves them when their node is lost."""

SYSTEM_IDS = max(SERVICE_ID, REGISTRY_ID, RELOCATOR_ID)
"""The highest id kept for the runtime's own actors; spawned actors' ids start above it.

Their messages are control and some wait long (lookups, ``wait_stopped``), so
``mailbox_size`` does not bound them: a full window must never block a stop.
"""
