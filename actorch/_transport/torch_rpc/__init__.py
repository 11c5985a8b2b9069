"""The torch RPC (TensorPipe) kind of transport, a package of its own: the one home of ``torch.distributed.rpc``.

``options`` is its options record, ``TorchRpc``, what users pass to pick it;
``plugin`` its ``Kind`` (the line of ``kinds.KINDS``) and which of its
transports a world spec opens. ``rpc`` is the transport of a static world
(``RpcTransport``), ``elastic`` the one of a world that nodes join and leave
while it runs, ``inbox`` the typed items torch's threads hand the loop,
``rpc_setup`` its device maps, rendezvous store and the world's secret,
``lone`` a node alone that opens an elastic world when it first starts a node
process. Only ``rpc`` and ``elastic`` import ``torch.distributed.rpc``. What it
shares with any transport (link order, the join protocol, the heartbeat's
judgement) lives beside this package; the fast lane is a wrapper beside it
(``lane``), which it lets share its links.
"""
