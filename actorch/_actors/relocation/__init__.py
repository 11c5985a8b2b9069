"""Actors that outlive their node (``Restart(relocate=True)``): where they may move, who moves them, refs that follow.

``spec`` (``RelocationSpec`` and the nodes a relocatable actor may live on),
``relocator`` (rank 0's system actor that keeps snapshots and moves actors),
``relocatables`` (one node's relocatable actors) and ``movable``
(``MovableRef``). Nothing is imported here, so importing one module does not
import the others.
"""
