"""One node's part of the system: its ``ActorSystem``, how it spawns, its host and the lives of its actors.

The top floor of ``_actors``: it builds on every other room and no room
imports it. ``node_system`` (``NodeSystem``, each node's ``ActorSystem``,
and ``open_system``), ``spawner`` (a spawn's arguments checked, then
placed), ``host`` (``ActorHost``: the node, and its part in the system,
behind public methods), ``lifecycle`` (actors built, started, restarted and
stopped), ``supervisor`` (restart counts and how actors ended), ``service``
(``NodeService``, the system actor every node hosts) and ``processes`` (node
processes on demand, ``NodePool``). Nothing is imported here, so importing
one module does not import the others.
"""
