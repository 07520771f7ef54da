"""The files mapped into this process, read from its memory map.

Three parts of the package ask which shared library the loader mapped for a
name (the NVRTC build whose PTX a record holds, the OpenBLAS pools whose
thread counts the rank decision lowers, the ordering library that names an
analysis in the cache). A process with CUDA's libraries loaded lists
thousands of mappings, so the map is searched as bytes for the name and
only the lines that hold it are split (splitting every line in Python cost
tens of milliseconds of a first call).
"""

from __future__ import annotations

import os

__all__ = ["MAPS", "mapped_paths"]

#: The memory map of this process (Linux).
MAPS = "/proc/self/maps"


def mapped_paths(fragment: str, maps: str = MAPS) -> list:
    """Paths of the files mapped into this process that contain ``fragment``.

    Parameters
    ----------
    fragment : str
        Part of the path (ASCII letters compared without case), e.g. a
        library's name.
    maps : str
        The memory map to read (a file of ``/proc/self/maps``'s format).

    Returns
    -------
    list of str
        Each path once, in the map's order; empty where the map cannot be
        read (not Linux) or holds none.
    """
    try:
        with open(maps, "rb") as fh:
            text = fh.read()
    except OSError:
        return []
    key = os.fsencode(fragment).lower()
    low = text.lower()                  # same offsets: ASCII case only
    paths = []
    at = low.find(key)
    while at >= 0:
        start = text.rfind(b"\n", 0, at) + 1
        end = text.find(b"\n", at)
        end = len(text) if end < 0 else end
        fields = text[start:end].split(None, 5)
        path = fields[5].strip() if len(fields) == 6 else b""
        if path and path not in paths:
            paths.append(path)
        at = low.find(key, end)
    return [os.fsdecode(path) for path in paths]
