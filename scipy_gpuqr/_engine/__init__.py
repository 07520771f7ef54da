"""Executors of the task lists: the GPU uberkernel loop and the NumPy reference executor."""
