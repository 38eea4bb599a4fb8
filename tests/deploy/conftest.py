"""The rendered overlays, once per session (kubectl runs three times in all)."""

from __future__ import annotations

import pytest

from tests.deploy.render import Docs, render_overlays


@pytest.fixture(scope="session")
def rendered() -> dict[str, Docs]:
    """Each overlay's documents, as `kubectl kustomize` renders them."""
    return render_overlays()
