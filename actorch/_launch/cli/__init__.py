"""The ``actorch`` command: its parser, one module per command, and what ``actorch run``'s ranks run.

The top floor of ``_launch``. ``command`` (the parser and ``main``, which
``_actorch_cli`` and ``python -m actorch`` call), ``run`` (``actorch run``,
through ``torch.distributed.run``), ``serve``, ``status`` (``actorch status``
and ``actorch stop``), ``stacks``, ``history``, ``tables`` (what ``status``
prints), ``runner`` (each rank's script) and ``reference`` (docs/cli.md, from
the parser). Nothing is imported here: ``--help``, ``status`` and ``stop``
import no torch, and ``run`` and ``serve`` import it only when they run.
"""
