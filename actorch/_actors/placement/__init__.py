"""Which node an actor goes to: ``Where``, the ``Where`` placer, what nodes lend (GPUs, resources).

``where`` (what a spawn asks of its node), ``fit`` (whether a node fits, and
why not), ``where_placer`` (``spawn(on=Where(...))``, groups, ``add_nodes``,
``wait_nodes``), ``gpus`` (``gpus=`` and each node's ``GpuPool``) and
``holdings`` (what a node's actors hold of its resources). Nothing is
imported here, so importing one module does not import the others.
"""
