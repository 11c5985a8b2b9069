"""Layer 1, the base: errors, names, deadlines, the codec, tensor files and the options; it imports no other layer."""
