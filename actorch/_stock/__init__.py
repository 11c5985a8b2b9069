"""The stock actors: parameter servers, replay buffers, RL agents and observers, groups.

Ready-made actors and clients for the common roles of distributed training,
written only against the public API (names in ``actorch.__all__``), as a user
would write them; they may share helpers among themselves. The public modules
``actorch.rl``, ``actorch.replay``, ``actorch.params`` and ``actorch.group``
export them, so users never import from here.
"""
