"""The ``actorch`` command: its parser, one module per command, and the runner of ``actorch run``'s ranks."""
