"""How ``actorch run`` runs a script in each process: ``python -m actorch._launch.cli.runner script.py args...``.

The script runs as ``python script.py args`` would run it (``__main__``, its
own ``sys.argv``, its directory first on ``sys.path``). Two things differ, both
about how the process ends. Ctrl-C ends it with exit code 130 and no
traceback: ``actorch.run`` has already shut the system down in order, and the
interrupt's traceback would only walk through actorch's own frames. And under
torchrun, an uncaught exception is also written to torchrun's error file
(``TORCHELASTIC_ERROR_FILE``), as torchrun's ``@record`` does, so that
``actorch run`` can name it in its closing line (and show its traceback where
the rank's stderr went to a file); with ``-n 1`` the runner says that line itself.
"""

from __future__ import annotations

import os
import runpy
import sys
from types import TracebackType

__all__ = ["main"]


def main(argv: list[str]) -> int:
    """Run the script ``argv[0]`` with the arguments ``argv[1:]``; the exit code."""
    script = argv[0]
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    try:
        runpy.run_path(script, run_name="__main__")
    except KeyboardInterrupt:
        if "TORCHELASTIC_RUN_ID" not in os.environ:  # under torchrun, actorch run's agent says it once
            print("actorch run: interrupted", file=sys.stderr)
        return 130
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - reported as Python would, from the script's frames down
        exc = exc.with_traceback(_from_script(exc.__traceback__))
        if os.environ.get("TORCHELASTIC_ERROR_FILE"):
            from torch.distributed.elastic.multiprocessing.errors import ErrorHandler  # noqa: PLC0415

            ErrorHandler().record_exception(exc)
        sys.excepthook(type(exc), exc, exc.__traceback__)
        if "TORCHELASTIC_RUN_ID" not in os.environ:  # under torchrun, actorch run's agent says it, for every rank
            print(f"actorch run: {script} failed on rank 0: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


def _from_script(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` without its first entries, this module's and runpy's: the script's frame comes first."""
    while tb is not None and tb.tb_frame.f_code.co_filename in (__file__, "<frozen runpy>", runpy.__file__):
        tb = tb.tb_next
    return tb


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
