"""``version_of``: an installed distribution's version from its metadata, a placeholder for a bare source tree."""

from __future__ import annotations

import importlib.metadata

from actorch._base.version import UNKNOWN_VERSION, version_of


def test_version_of_an_installed_distribution_is_its_metadata_version() -> None:
    assert version_of("torch") == importlib.metadata.version("torch")


def test_version_of_a_distribution_not_installed_is_the_unknown_version() -> None:
    assert version_of("actorch-no-such-distribution") == UNKNOWN_VERSION
