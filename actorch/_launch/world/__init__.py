"""The world's start: ``run``, ``start``, ``connect`` and ``serve``, the node processes, and their bounded end."""
