"""The tensor data plane: channels that carry a message's tensors apart from its bytes, one module each.

``base`` holds the interface (:class:`~actorch._base.channels.base.Channel`)
and ``route`` what a sender knows of a destination; ``plane`` the order
channels are tried in and their counts. The channels: ``metadata`` (tensors of
no elements), ``inline`` (small ones in the message), ``shm`` (same host, by
reference; its segments and pool in ``segments``, the user's zero-copy
``leases``), ``device_map`` and ``staged`` (GPU tensors through TensorPipe's
maps or through host memory) and ``by_value`` (the transport's own path).
"""
