"""Reading a model back: inputs to feed it (feeds) and judging its outputs against a reference (compare)."""
