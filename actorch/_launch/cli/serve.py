"""``actorch serve``: join a running elastic system from this host, as a node, or as the host's agent (``--pool``).

It is ``actorch.serve()`` from a shell: the address from ``--address`` or
``ACTORCH_ADDRESS``, the token from ``ACTORCH_JOIN_TOKEN`` only (never a
flag, so that it stays off command lines). With ``--pool`` the node is the
host agent of this host: the system starts node processes here
(``add_nodes(..., host=...)``, ``Where(process="own", host=...)``). Actor classes
are imported by their module path, so the current directory comes first on
``sys.path``, as with ``python -m``.
"""

from __future__ import annotations

import argparse
import os
import sys

from actorch._base.errors import JoinError
from actorch._base.resources import check_resources

__all__ = ["parse_resource", "serve_command"]


def parse_resource(text: str) -> tuple[str, float]:
    """``NAME=AMOUNT`` (``env_slots=4``) as a pair, checked as ``run(resources=...)`` checks it."""
    name, equals, amount = text.partition("=")
    try:
        value = float(amount)
    except ValueError:
        value = -1.0
    if not equals:
        raise argparse.ArgumentTypeError(f"expected NAME=AMOUNT, not {text!r}")
    try:
        checked = check_resources({name: value})
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None
    return name, checked[name]


def serve_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``actorch serve``: join the system and serve until it ends or this node leaves; the exit code."""
    # Imported here, as they import torch: the parser takes parse_resource from this module, and --help is quick.
    from actorch._launch.world.serving import serve  # noqa: PLC0415
    from actorch._transport.membership import ADDRESS_ENV, TOKEN_ENV  # noqa: PLC0415

    if not (args.address or os.environ.get(ADDRESS_ENV)):
        parser.exit(2, f"actorch serve: error: no system address: pass --address or set {ADDRESS_ENV}\n")
    if not os.environ.get(TOKEN_ENV):
        parser.exit(2, f"actorch serve: error: set {TOKEN_ENV} to the system's join token (system.join_env())\n")
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)
    try:
        return serve(
            args.address,
            name=args.name,
            join_timeout=args.join_timeout,
            resources=dict(args.resource or ()),
            pool=args.pool,
        )
    except JoinError as exc:
        print(f"actorch serve: {exc}", file=sys.stderr)
        return 1
