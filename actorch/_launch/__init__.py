"""Layer 5, launching: ``run``, ``start``, ``connect`` and ``serve``, the services of a running system, and the command.

Its rooms stand on four floors, the highest first below. A module imports
from rooms on its own floor and the floors beneath, never from one above: not
inside a function, not for annotations either (``tests/project/test_layers.py``
holds the order). From the layers below it takes no underscored name, and it
reaches transports only through the table of kinds (``_transport/kinds``).
The library never configures logging: only the launch does.

4. ``cli/``: the ``actorch`` command: its parser (``command``), one module
   per command (``run``, ``serve``, ``status`` with ``stop``, ``stacks``,
   ``history``), the tables ``status`` prints, the ``runner`` every rank of
   ``actorch run`` runs its script under, and ``reference``, which writes
   docs/cli.md. ``--help``, ``status`` and ``stop`` import no torch.
3. ``world/``: the world's start and end: ``run`` and its plan, the local
   world and its workers, rank 0's lead, one node's start, what the other
   nodes serve (``serve``), node processes on demand, ``start`` from a running
   loop, ``connect``, the bounded event loop and its watchdog, Ctrl-C and
   SIGTERM, and the missing main guard.
2. ``services/``: what a running system offers those who run it: the status
   rank 0 serves (``status``, and its metrics, ``prometheus``), the runtime
   files that let the command find a system (``runtime``), and the logging
   set-up (``logs``).
1. ``options/``: the options of a launch, resting on nothing they configure:
   ``SystemOptions`` (``system_options``), the environment variables that
   stand in for options (``environment``), and a node's setup (``setup``).
"""
