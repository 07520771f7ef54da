"""What the subcommands and the dispatcher share: the one-line error.

Light on purpose (the dispatcher imports it at start-up, before any
subcommand module is loaded).
"""

from __future__ import annotations

__all__ = ["CommandError"]


class CommandError(Exception):
    """An error to report on one line (exit status 2)."""
