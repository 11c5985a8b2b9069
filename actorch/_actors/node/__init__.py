"""One node's part of the system: its ``ActorSystem``, how it spawns, its host and the lives of its actors.

``node_system`` (``NodeSystem``, each node's ``ActorSystem``, and
``open_system``), ``spawner`` (a spawn's arguments checked, then placed),
``spawn_request`` (one spawn as a value), ``host`` (``ActorHost``: the node and
its part in the system), ``lifecycle`` (actors built, started, restarted and
stopped), ``supervisor`` (restart counts and how actors ended), ``service``
(``NodeService``, the system actor every node hosts), ``node_request``
(node processes to start, as a value) and ``processes`` (node processes on
demand, ``NodePool``). Nothing is imported here, so importing one
module does not import the others.
"""
