"""The options of a launch, declared and checked once, and the words they are given in.

The lowest floor of ``_launch``: it rests on the layers below and on nothing
it configures, so every other room can take its options from here.
``system_options`` (``SystemOptions``: every option of ``run``, ``start``,
``local_world`` and ``actorch run``, the keywords a type checker sees, the
``SystemConfig`` every node shares, and what an option leaves to the
environment), ``environment`` (the variables that stand in for options, and
the log levels: the standard library alone, as the command imports it) and
``setup`` (a node's setup function, of its rank or of its system). Nothing is
imported here, so importing one module does not import the others.
"""
