"""The fast lane: direct TCP connections between nodes, a path any kind of transport can put beside its main one.

``connections`` holds this node's end of it (its listener, a connection to
each peer, the handshake that keeps strangers out, the frames); ``transport``
the ``LaneTransport`` that wraps a kind's transport and sends on the lane the
bundles that carry no tensors of their own, sharing the wrapped transport's
links (``capabilities.SharedLinks``) so that both paths' bundles arrive in
send order, and judging the lane's silence through the kernel.
"""
