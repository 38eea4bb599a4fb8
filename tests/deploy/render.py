"""Renders deploy/kustomize's overlays with kubectl and picks documents out of them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
OVERLAYS = ("single-node", "production", "inference-pool")
KUBECTL = "/usr/bin/kubectl"

Docs = list[dict[str, Any]]


def kubectl() -> str:
    """kubectl's path; a missing kubectl fails the test run with the reason."""
    path = shutil.which("kubectl") or (KUBECTL if Path(KUBECTL).exists() else None)
    if path is None:
        pytest.fail("kubectl (with kustomize) is required to render deploy/kustomize: install it")
    return path


def render_overlays() -> dict[str, Docs]:
    """Each overlay's documents, as `kubectl kustomize` renders them."""
    out: dict[str, Docs] = {}
    for name in OVERLAYS:
        result = subprocess.run(
            [kubectl(), "kustomize", str(DEPLOY / "kustomize" / "overlays" / name)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, f"{name}: {result.stderr}"
        out[name] = [d for d in yaml.safe_load_all(result.stdout) if d]
    return out


def pod_specs(docs: Docs) -> list[tuple[str, dict[str, Any]]]:
    """(kind/name, pod spec) of every workload."""
    kinds = ("Deployment", "StatefulSet", "Job")
    return [
        (f"{d['kind']}/{d['metadata']['name']}", d["spec"]["template"]["spec"])
        for d in docs
        if d["kind"] in kinds
    ]


def of_kind(docs: Docs, kind: str) -> Docs:
    """The documents of one kind."""
    return [d for d in docs if d["kind"] == kind]
