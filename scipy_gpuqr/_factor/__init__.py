"""_factor."""
