"""Layer 3, the message engine of one node: cells, calls out and in, flow control; it knows endpoints by name only."""
