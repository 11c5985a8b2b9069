"""The torch RPC (TensorPipe) transport, a plug-in of its own: the one home of ``torch.distributed.rpc``.

``rpc`` is the transport of a static world (``RpcTransport``), with the fast
lane beside it for bundles without tensors of their own; ``elastic`` the one of
a world that nodes join and leave while it runs; ``rpc_setup`` its options,
device maps and rendezvous store; ``lone`` a node alone that opens an elastic
world when it first starts a node process. Only ``rpc`` and ``elastic`` import
``torch.distributed.rpc``. What it shares with any transport (link order, the
lane, the join protocol, the heartbeat's judgement) lives beside this package.
"""
