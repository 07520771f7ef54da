"""Per-front bucket schedulers, the sparse scheduler across fronts, and the task encoding."""
