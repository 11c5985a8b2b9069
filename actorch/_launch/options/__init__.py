"""The options of a launch, and the words they are given in: the lowest floor of ``_launch``."""
