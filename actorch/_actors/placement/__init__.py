"""Which node an actor goes to: the one placer, whether a node fits, what nodes lend (GPUs, resources).

Above the core of ``_actors`` and below ``relocation/`` and ``node/``: it
speaks the layer's vocabulary (``Where``, ``SpawnRequest``, ``NodeRequest``,
``NodeShare``), calls the services through ``ServiceEndpoints`` and sees its
node's host as a ``PlacerHost``. ``fit`` (whether a node fits, and why not),
``where_placer`` (the ``Placer`` every spawn and group goes through,
``add_nodes``, ``wait_nodes``), ``gpus`` (each node's ``GpuPool``) and
``holdings`` (what a node's actors hold of its resources). Nothing is
imported here, so importing one module does not import the others.
"""
