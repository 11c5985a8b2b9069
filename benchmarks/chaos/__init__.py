"""The chaos soak's parts; ``benchmarks/soak_chaos.py`` runs them and says what they check.

Every node imports them by these names (``chaos.roles:Echo``): the soak puts
``benchmarks/`` on the path of every process it starts. The modules import
downward in this list:

- ``plan``: the run's events, drawn from its seed;
- ``records``: the values that cross nodes (a ledger's answer, a loss, what a sink saw);
- ``books``: the invariants' tallies, and the judgements made of faults, losses and memory;
- ``roles``: the actors every node hosts, the ledgers, the collectors' corridor;
- ``soak``: ``main``'s side of the run (the load, the faults, the checks).
"""
