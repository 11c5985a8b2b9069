"""Layer 1, the base: errors, names, deadlines, the codec, tensor forms and files, options; imports no other layer."""
