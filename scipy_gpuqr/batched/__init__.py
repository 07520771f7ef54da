"""batched."""
