"""Graph rewrites, one per module: each a function from a typed graph to a typed graph."""
