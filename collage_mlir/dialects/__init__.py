"""The `collage` vocabulary (discardable attributes) and thin StableHLO accessors."""
