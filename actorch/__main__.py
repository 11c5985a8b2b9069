"""``python -m actorch``: the ``actorch`` command (``actorch run``, ``actorch status``)."""

import sys

from actorch._launch.cli.command import main

if __name__ == "__main__":
    sys.exit(main())
