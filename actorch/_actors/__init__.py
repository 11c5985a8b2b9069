"""Layer 4, actors: ``Actor``, ``ActorRef``, the host of a node's actors, the registry, events and ``ActorSystem``.

Its rooms (a folder, or a module of its own) stand on five floors, the
highest first below. A module imports from rooms on its own floor and the
floors beneath, never from one above: not inside a function, not for
annotations either (``tests/project/test_layers.py`` holds the order). The
doors between rooms are narrow: a room says in a protocol what it needs of
the host (``PlacerHost``, ``RelocationHost``, ``PoolHost``, ``TracingHost``,
``ServiceBackend``), calls the runtime's own actors through the endpoints
declared beneath them (``system_endpoints``), and no module but the host
reads the engine's ``Node`` through it (``host.node``); the host offers
public methods instead.

5. ``node/``: one node's part of the system: ``NodeSystem``, the host, the
   lives of its actors, the node service, spawning, node processes.
4. ``relocation/``: actors that outlive their node, moved by rank 0's relocator.
3. ``placement/``: which node an actor goes to: the one placer, the fit
   predicate, the GPUs and resources nodes lend.
2. the core: ``actor``, ``ref``, ``system`` (the user's handle, its surface
   alone), ``system_endpoints``, ``registry``, ``events``, ``broadcast``,
   ``process_groups`` and ``tracing``.
1. the vocabulary every room speaks, records that import nothing of the layer
   but each other: ``restart`` (``Restart``, ``ActorExit``), ``where``
   (``Where``), ``spawn_request`` (``SpawnRequest``), ``node_request``
   (``NodeRequest``) and ``node_share`` (``NodeShare``).
"""
