"""Kernel variants of the tiled QR: none (its GPU tile operations are cuSOLVER
and cuBLAS calls through CuPy), declared so the kernel registry can list it."""

KERNEL_VARIANTS: dict = {}
