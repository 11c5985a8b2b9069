"""``NodeShare``: what one node says it has free for actors now, and who holds the rest.

Each node's service answers it (``NodeService.resources``), counting its
GPUs in with its other resources (``placement.holdings.node_share``); the
placer compares it with what a spawn holds (``placement.fit.lacks_free``),
and ``actorch status`` shows it as the node's ``free`` and ``held``. It is a
typed dict rather than a class: it travels as the plain mapping it is, and a
node's status takes its two entries in as they are. Part of the vocabulary
at the bottom of ``_actors``, so that the service's declared endpoints
(``system_endpoints``) can name it.
"""

from __future__ import annotations

from typing import TypedDict

__all__ = ["NodeShare"]


class NodeShare(TypedDict):
    """What a node has free and who holds what, by resource name (GPUs counted in).

    Attributes:
        free: What no actor holds now (``{"cpus": 3.0, "gpus": 1.0}``).
        held: What each holding actor holds, by holder (its name, or
            ``Class#id on node N`` for an unnamed one).
    """

    free: dict[str, float]
    held: dict[str, dict[str, float]]
