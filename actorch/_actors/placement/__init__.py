"""Which node an actor goes to: ``Where``, the one placer, what nodes lend (GPUs, resources).

``where`` (what a spawn asks of its node, ``on=rank`` and ``gpus=`` included),
``fit`` (whether a node fits, and why not), ``where_placer`` (the ``Placer``
every spawn and group goes through, ``add_nodes``, ``wait_nodes``), ``share``
(what a node says it has free, ``NodeShare``), ``gpus`` (each node's
``GpuPool``) and ``holdings`` (what a node's actors hold of its resources).
Nothing is imported here, so importing one module does not import the others.
"""
