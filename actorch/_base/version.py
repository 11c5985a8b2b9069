"""actorch's version, as its installed distribution's metadata says (``actorch.__version__``)."""

from __future__ import annotations

from importlib import metadata

__all__ = ["UNKNOWN_VERSION", "version_of"]

UNKNOWN_VERSION = "0+unknown"
"""The version of a source tree imported without being installed: it has no metadata to read."""


def version_of(distribution: str) -> str:
    """The installed version of ``distribution``, or ``UNKNOWN_VERSION`` where it is not installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return UNKNOWN_VERSION
