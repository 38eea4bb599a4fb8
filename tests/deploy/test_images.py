"""deploy/images: the Dockerfiles, linted structurally (no docker here to build them)."""

from __future__ import annotations

import re

import pytest

from tests.deploy.render import DEPLOY, REPO, Docs, pod_specs

DOCKERFILES = ("engine-cuda", "engine-cpu", "gateway")


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfile_structure(rendered: dict[str, Docs], name: str) -> None:
    text = (DEPLOY / "images" / f"{name}.Dockerfile").read_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    froms = [ln for ln in lines if ln.upper().startswith("FROM ")]
    assert len(froms) >= 2, "multi-stage"
    args = dict(
        ln.split(None, 1)[1].split("=", 1) for ln in lines if ln.startswith("ARG ") and "=" in ln
    )
    for line in froms:
        image = line.split()[1]
        image = args.get(image.strip("${}"), image)
        if image in {"ui", "build"}:
            continue
        assert re.fullmatch(r"[\w./-]+:[\w.-]+", image) and not image.endswith(":latest"), image
    users = [ln.split()[1] for ln in lines if ln.upper().startswith("USER ")]
    assert users and users[-1].split(":")[0] == "10001"
    assert not re.search(r"^ADD\s+https?://", text, re.M | re.I)
    exposed = {int(p) for ln in lines if ln.startswith("EXPOSE") for p in ln.split()[1:]}
    image_tag = f"cloister-{name}:" if name != "gateway" else "cloister-gateway:"
    ports = {
        p["containerPort"]
        for docs in rendered.values()
        for _, spec in pod_specs(docs)
        for c in spec["containers"]
        if c["image"].startswith(image_tag)
        for p in c.get("ports", [])
    }
    assert ports and ports <= exposed, (ports, exposed)
    if name == "engine-cpu":
        assert "download.pytorch.org/whl/cpu torch==2.13.0" in text


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfile_copies_only_what_the_context_has(name: str) -> None:
    """Every COPY from the build context names a path the repository has, and the
    Dockerfile's own .dockerignore keeps none of them out."""
    text = (DEPLOY / "images" / f"{name}.Dockerfile").read_text()
    ignored = {
        ln.strip()
        for ln in (DEPLOY / "images" / f"{name}.Dockerfile.dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    }
    sources = [
        src
        for ln in text.splitlines()
        if ln.startswith("COPY ") and "--from=" not in ln
        for src in ln.split()[1:-1]
    ]
    assert {"engine", "tenancy", "platform", "migrations", "admin_ui"} <= set(sources)
    for src in sources:
        assert (REPO / src).exists(), src
        assert src not in ignored, src
