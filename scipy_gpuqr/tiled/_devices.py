"""The devices of the tiled QR by name: ``'cpu'`` or ``'gpu:N'``.

Below both the planner (:mod:`._qr`) and the calibration (:mod:`._calibrate`),
which times real tiled QR runs, so neither imports the other for its devices.
Making a GPU device imports CuPy; importing this module does not.
"""

from __future__ import annotations

from ._cpu_device import HostDevice
from ._gpu_device import GpuDevice

__all__ = ["make_device"]


def make_device(name: str, panel_leaf: int = 0):
    """The device object of ``name``.

    Parameters
    ----------
    name : str
        ``'cpu'`` or ``'gpu:N'``.
    panel_leaf : int
        A GPU's leaf width of the recursive panel factorization
        (:class:`._gpu_device.GpuDevice`).

    Returns
    -------
    HostDevice or GpuDevice
    """
    if name == "cpu":
        return HostDevice("cpu")
    return GpuDevice(int(name.split(":")[1]), panel_leaf=panel_leaf)
