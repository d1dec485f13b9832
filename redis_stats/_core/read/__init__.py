"""The reader's half of the core, no I/O: decode a read (decoder, groups), its arithmetic
(values), who is up (liveness), which engines (slices)."""
