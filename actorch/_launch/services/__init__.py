"""What a running system offers those who run it: its status, its metrics, its runtime files, its logs.

Above ``options/`` and below the world's start, which runs them: rank 0
serves ``status`` (the live status over HTTP, ``actorch status`` and
``actorch stacks`` its clients) with ``prometheus`` (the same as Prometheus
metrics) and writes its ``runtime`` file (how the command finds a system on
its host); every node's ``logs`` are set up here. Nothing is imported here:
the command imports the light modules without torch.
"""
