"""Faults below the process: a FUSE layer that loses what was never synced (``lazyfs``)."""

from tests.fault.lazyfs import Control, fuse_available, mounted

__all__ = ["Control", "fuse_available", "mounted"]
