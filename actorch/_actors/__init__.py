"""Layer 4, actors: ``Actor``, ``ActorRef``, the host of a node's actors, the registry, events and ``ActorSystem``."""
