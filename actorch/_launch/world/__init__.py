"""The world's start and end: ``run``, ``start``, ``connect`` and ``serve``, the node processes, the bounded exit.

Above ``options/`` and ``services/``, below the command. ``run`` (the plan,
and which of three ways the world starts), ``local`` (a local launch's world:
rank 0's transport and the worker processes), ``lead`` (rank 0: ``main``,
the status and runtime file, the shutdown), ``startup`` (how one node
starts), ``serving`` (what every other node runs, ``serve`` among them),
``nodes`` (node processes on demand, tied to their starter), ``workers``
(killing and reaping them), ``start`` (from a running event loop),
``connect`` (a driver that joins), ``eventloop`` (the bounded loop and the
watchdog), ``interrupts`` (Ctrl-C and SIGTERM) and ``guard`` (a script
without its main guard). Nothing is imported here, so importing one module
does not import the others.
"""
