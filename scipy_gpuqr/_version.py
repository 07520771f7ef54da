"""Version of scipy_gpuqr (one place, read by pyproject.toml)."""

__version__ = "0.1.0"
