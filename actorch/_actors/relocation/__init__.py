"""Actors that outlive their node (``Restart(relocate=True)``): where they may move, who moves them, refs that follow.

Above ``placement/`` (it places a moved actor by the same fit predicate) and
below ``node/``, which builds it: the relocator sees rank 0's host as a
``RelocationHost`` and has services build actors through ``ServiceEndpoints``.
``spec`` (``RelocationSpec`` and the nodes a relocatable actor may live on),
``relocator`` (rank 0's system actor that keeps snapshots and moves actors),
``relocatables`` (one node's relocatable actors), ``movable`` (``MovableRef``)
and ``snapshots`` (``SnapshotStore``). Nothing is imported here, so
importing one module does not import the others.
"""
