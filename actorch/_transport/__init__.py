"""Layer 2, the transport: moving bundles of opaque messages between ranks, in-process or over torch RPC."""
