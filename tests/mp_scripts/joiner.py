"""A process that joins a running elastic system: ``python joiner.py LABEL [JOIN_TIMEOUT [ASKING_FILE]]``.

With ``ASKING_FILE`` it writes that file once it holds a rank, just before it
asks rank 0 to let it in (its ``setup`` runs then), so that a test can race it.

The address and token come from the environment (``ACTORCH_ADDRESS``,
``ACTORCH_JOIN_TOKEN``), as a user passes them. It prints ``JOINERROR <text>``
and exits 3 if the system refused it, else exits with ``serve``'s code.
"""

from __future__ import annotations

import sys
from pathlib import Path

import actorch

if __name__ == "__main__":
    label = sys.argv[1]
    timeout = float(sys.argv[2]) if len(sys.argv) > 2 else 30.0
    asking = Path(sys.argv[3]) if len(sys.argv) > 3 else None

    def setup(rank: int) -> None:
        if asking is not None:
            asking.write_text(str(rank))

    try:
        code = actorch.serve(name=label, join_timeout=timeout, setup=setup)
    except actorch.JoinError as exc:
        print(f"JOINERROR {exc}", flush=True)
        sys.exit(3)
    sys.exit(code)
