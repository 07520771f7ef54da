"""tiled."""
