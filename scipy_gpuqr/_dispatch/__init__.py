"""_dispatch."""
