"""deploy/: every kustomize overlay renders, validates offline, and keeps its invariants.

Built-in kinds are checked with `kubernetes_validate` (Kubernetes 1.30, strict); the CRDs
it does not know against the schema subsets in crd_schemas/. kubectl (with kustomize)
is required: without it these tests fail, they do not skip.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from tests.deploy import render
from tests.deploy.render import OVERLAYS, Docs, of_kind, pod_specs

SCHEMAS = Path(__file__).parent / "crd_schemas"
CRD_SCHEMA_FILES = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor.monitoring.coreos.com_v1",
    ("inference.networking.k8s.io/v1", "InferencePool"): (
        "inferencepool.inference.networking.k8s.io_v1"
    ),
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): "httproute.gateway.networking.k8s.io_v1",
    ("gateway.networking.k8s.io/v1", "Gateway"): "gateway.gateway.networking.k8s.io_v1",
}
KUBERNETES_VERSION = "1.30"

EXPECTED_KINDS: dict[str, dict[str, int]] = {
    "single-node": {
        "Namespace": 1,
        "ServiceAccount": 1,
        "Secret": 1,
        "PersistentVolumeClaim": 1,
        "Deployment": 1,
        "Service": 1,
    },
    "production": {
        "Namespace": 1,
        "ServiceAccount": 1,
        "ConfigMap": 1,
        "Secret": 4,
        "PersistentVolumeClaim": 1,
        "Job": 1,
        "Deployment": 3,  # gateways, engines of model 1, engines of model 2
        "StatefulSet": 2,  # Redis, PostgreSQL
        "Service": 5,
        "HorizontalPodAutoscaler": 3,
        "PodDisruptionBudget": 3,
        "NetworkPolicy": 5,
        "ServiceMonitor": 2,
    },
}
EXPECTED_KINDS["inference-pool"] = {
    **EXPECTED_KINDS["production"],
    "Deployment": 5,  # + one endpoint picker per pool
    "Service": 7,
    "ServiceAccount": 2,
    "Role": 1,
    "RoleBinding": 1,
    "NetworkPolicy": 8,
    "Gateway": 1,
    "HTTPRoute": 2,
    "InferencePool": 2,
}

PLACEHOLDER = "REPLACE-ME"
GATEWAY_POD = {"app.kubernetes.io/name": "cloister", "app.kubernetes.io/component": "gateway"}
SCRAPER = (
    {"kubernetes.io/metadata.name": "monitoring"},
    {"app.kubernetes.io/name": "prometheus"},
)
# With GIE, the inference Gateway's proxy and the endpoint pickers reach the engines too.
GIE_PEERS = (
    {"gateway.networking.k8s.io/gateway-name": "cloister-inference"},
    {"app.kubernetes.io/component": "endpoint-picker"},
)


def test_missing_kubectl_fails_not_skips(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(render, "KUBECTL", "/nonexistent/kubectl")
    with pytest.raises(pytest.fail.Exception, match="kubectl .* is required"):
        render.kubectl()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_expected_kinds(rendered: dict[str, Docs], overlay: str) -> None:
    kinds = Counter(d["kind"] for d in rendered[overlay])
    assert dict(kinds) == EXPECTED_KINDS[overlay]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_document_validates(rendered: dict[str, Docs], overlay: str) -> None:
    for doc in rendered[overlay]:
        key = (doc["apiVersion"], doc["kind"])
        where = f"{overlay}: {doc['kind']}/{doc['metadata']['name']}"
        if key in CRD_SCHEMA_FILES:
            schema = json.loads((SCHEMAS / f"{CRD_SCHEMA_FILES[key]}.json").read_text())
            errors = list(jsonschema.Draft202012Validator(schema).iter_errors(doc))
            assert not errors, f"{where}: {[e.message for e in errors]}"
            continue
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            pytest.fail(f"{where}: no schema (add one to crd_schemas/)")
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{where}: {exc.message}")


def test_crd_schemas_reject_a_broken_document() -> None:
    """The subsets are strict enough to catch a misspelt field or a bad port."""
    schema = json.loads((SCHEMAS / "inferencepool.inference.networking.k8s.io_v1.json").read_text())
    pool = {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": "p"},
        "spec": {
            "selector": {"matchLabels": {"a": "b"}},
            "targetPortNumber": 8100,  # the v1alpha2 field name
            "endpointPickerRef": {"name": "epp", "port": {"number": 9002}},
        },
    }
    assert list(jsonschema.Draft202012Validator(schema).iter_errors(pool))
    pool["spec"]["targetPorts"] = [{"number": 70000}]
    del pool["spec"]["targetPortNumber"]
    assert list(jsonschema.Draft202012Validator(schema).iter_errors(pool))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_containers_run_non_root_on_read_only_root(rendered: dict[str, Docs], overlay: str) -> None:
    for where, spec in pod_specs(rendered[overlay]):
        pod_ctx = spec.get("securityContext", {})
        assert pod_ctx.get("runAsNonRoot") is True, where
        assert pod_ctx.get("runAsUser", 0) > 0, where
        # Only the endpoint pickers call the Kubernetes API (they watch their pool).
        wants_token = spec.get("serviceAccountName") == "cloister-epp"
        assert spec.get("automountServiceAccountToken") is wants_token, where
        for c in spec.get("initContainers", []) + spec["containers"]:
            ctx = c.get("securityContext", {})
            assert ctx.get("readOnlyRootFilesystem") is True, f"{where}/{c['name']}"
            assert ctx.get("allowPrivilegeEscalation") is False, f"{where}/{c['name']}"
            assert ctx.get("capabilities", {}).get("drop") == ["ALL"], f"{where}/{c['name']}"
            mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
            if c["image"].startswith("cloister-"):
                assert "/tmp" in mounts, f"{where}/{c['name']}: no writable /tmp"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_workloads_request_resources_and_probe_health(
    rendered: dict[str, Docs], overlay: str
) -> None:
    for where, spec in pod_specs(rendered[overlay]):
        for c in spec.get("initContainers", []) + spec["containers"]:
            requests = c.get("resources", {}).get("requests", {})
            assert {"cpu", "memory"} <= set(requests), f"{where}/{c['name']}"
        if where.startswith("Job/"):
            continue
        for c in spec["containers"]:
            probe = c.get("readinessProbe")
            assert probe, f"{where}/{c['name']}: no readiness probe"
            if c["image"].startswith("cloister-"):
                assert probe["httpGet"]["path"] == "/health", where
                assert c["livenessProbe"]["httpGet"]["path"] == "/health", where


def test_engines_drain_within_their_grace_period(
    rendered: dict[str, Docs],
) -> None:
    engines = [
        d
        for d in of_kind(rendered["production"], "Deployment")
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == "engine"
    ]
    assert len(engines) == 2
    for d in engines:
        spec = d["spec"]["template"]["spec"]
        args = spec["containers"][0]["args"]
        drain = next(float(a.split("=", 1)[1]) for a in args if a.startswith("--drain-timeout-s="))
        assert spec["terminationGracePeriodSeconds"] > drain
        assert args[:2] == ["engine", "serve"] and "--port=8100" in args
        env = {e["name"] for e in spec["containers"][0]["env"]}
        assert "CLOISTER_SERVICE_TOKEN" in env


@pytest.mark.parametrize("overlay", ["production", "inference-pool"])
def test_gateways_serve_every_engine_model(rendered: dict[str, Docs], overlay: str) -> None:
    """Each engine's model is in the gateways' --model list and has an engine URL; in the
    router layout that URL's host is a headless Service selecting exactly those pods."""
    docs = rendered[overlay]
    deployments = of_kind(docs, "Deployment")
    (config,) = of_kind(docs, "ConfigMap")
    engines: dict[str, dict[str, Any]] = {}
    for d in deployments:
        if d["metadata"]["labels"]["app.kubernetes.io/component"] != "engine":
            continue
        env = {
            e["name"]: e.get("value") for e in d["spec"]["template"]["spec"]["containers"][0]["env"]
        }
        # `env` wins over the shared ConfigMap (envFrom), as in the pod.
        engines[env.get("CLOISTER_MODEL_NAME") or config["data"]["CLOISTER_MODEL_NAME"]] = d
    (gateway,) = [d for d in deployments if d["metadata"]["name"] == "cloister-gateway"]
    args = gateway["spec"]["template"]["spec"]["containers"][0]["args"]
    served = {a.split("=", 2)[1] for a in args if a.startswith("--model=")}
    urls = dict(e.split("=", 1) for e in config["data"]["CLOISTER_ENGINE_URLS"].split(","))
    assert set(engines) == served == set(urls)
    services = {d["metadata"]["name"]: d for d in of_kind(docs, "Service")}
    for model, engine in engines.items():
        labels = engine["spec"]["template"]["metadata"]["labels"]
        assert labels["cloister.dev/model"] == model
        if overlay == "inference-pool":
            continue
        host, port = urls[model].removeprefix("dns+http://").split(":")
        service = services[host]
        assert service["spec"]["clusterIP"] == "None" and port == "8100"
        assert service["spec"]["selector"].items() <= labels.items()
        assert service["spec"]["selector"]["cloister.dev/model"] == model


def engine_policy_peers(docs: list[dict[str, Any]]) -> list[tuple[dict[str, str], ...]]:
    """For every ingress rule of a policy selecting engine pods: its peers' selectors."""
    peers: list[tuple[dict[str, str], ...]] = []
    for pol in of_kind(docs, "NetworkPolicy"):
        selected = pol["spec"]["podSelector"].get("matchLabels", {})
        if selected.get("app.kubernetes.io/component") != "engine":
            continue
        for rule in pol["spec"]["ingress"]:
            assert [p["port"] for p in rule["ports"]] == [8100], pol["metadata"]["name"]
            for peer in rule["from"]:
                ns = peer.get("namespaceSelector", {}).get("matchLabels")
                pod = peer.get("podSelector", {}).get("matchLabels", {})
                peers.append((ns, pod) if ns else (pod,))
    return peers


def canon(selectors: tuple[dict[str, str], ...]) -> str:
    """A peer's selectors as one comparable string."""
    return json.dumps(selectors, sort_keys=True)


@pytest.mark.parametrize("overlay", ["production", "inference-pool"])
def test_engines_admit_only_gateways_and_the_scraper(
    rendered: dict[str, Docs], overlay: str
) -> None:
    docs = rendered[overlay]
    default_deny = [
        p
        for p in of_kind(docs, "NetworkPolicy")
        if p["spec"]["podSelector"] == {} and "ingress" not in p["spec"]
    ]
    assert default_deny, "no default-deny ingress policy"
    allowed = {canon((GATEWAY_POD,)), canon(SCRAPER)}
    if overlay == "inference-pool":
        allowed |= {canon((peer,)) for peer in GIE_PEERS}
    peers = {canon(p) for p in engine_policy_peers(docs)}
    assert peers == allowed


def test_datastores_admit_only_gateways_and_jobs(
    rendered: dict[str, Docs],
) -> None:
    ports = {"postgres": 5432, "redis": 6379}
    found = set()
    for pol in of_kind(rendered["production"], "NetworkPolicy"):
        component = (
            pol["spec"]["podSelector"].get("matchLabels", {}).get("app.kubernetes.io/component")
        )
        if component not in ports:
            continue
        found.add(component)
        for rule in pol["spec"]["ingress"]:
            assert [p["port"] for p in rule["ports"]] == [ports[component]]
            for peer in rule["from"]:
                assert set(peer) == {"podSelector"}
                labels = peer["podSelector"]["matchLabels"]
                assert labels["app.kubernetes.io/component"] in {"gateway", "migrate"}
    assert found == set(ports)


@pytest.mark.parametrize("overlay", ["production", "inference-pool"])
def test_migration_job_runs_before_gateways_serve(rendered: dict[str, Docs], overlay: str) -> None:
    docs = rendered[overlay]
    (job,) = of_kind(docs, "Job")
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:2] == ["db", "upgrade"]
    (gateway,) = [
        d for d in of_kind(docs, "Deployment") if d["metadata"]["name"] == "cloister-gateway"
    ]
    init = gateway["spec"]["template"]["spec"]["initContainers"]
    assert [c["args"][:2] for c in init] == [["db", "wait"]]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_secrets_hold_only_placeholders(rendered: dict[str, Docs], overlay: str) -> None:
    import base64

    secrets = of_kind(rendered[overlay], "Secret")
    assert secrets
    for secret in secrets:
        values = {k: base64.b64decode(v).decode() for k, v in secret.get("data", {}).items()}
        values.update(secret.get("stringData", {}))
        for key, value in values.items():
            # Non-secret parts (user and database names) may be plain; secrets must not.
            if key in {"POSTGRES_USER", "POSTGRES_DB"}:
                continue
            assert PLACEHOLDER in value, f"{secret['metadata']['name']}.{key} looks real"


def test_production_scales_engines_on_queue_depth(
    rendered: dict[str, Docs],
) -> None:
    hpas = {
        d["spec"]["scaleTargetRef"]["name"]: d
        for d in of_kind(rendered["production"], "HorizontalPodAutoscaler")
    }
    for name in ("cloister-engine", "cloister-engine-qwen"):
        (metric,) = hpas[name]["spec"]["metrics"]
        assert metric["type"] == "Pods"
        assert metric["pods"]["metric"]["name"] == "vllm:num_requests_waiting"
    pdbs = {d["metadata"]["name"] for d in of_kind(rendered["production"], "PodDisruptionBudget")}
    assert pdbs == {"cloister-gateway", "cloister-engine", "cloister-engine-qwen"}


def test_inference_pool_selects_engine_pods_and_gateways_use_it(
    rendered: dict[str, Docs],
) -> None:
    docs = rendered["inference-pool"]
    engine_labels = [
        d["spec"]["template"]["metadata"]["labels"]
        for d in of_kind(docs, "Deployment")
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == "engine"
    ]
    pools = of_kind(docs, "InferencePool")
    for pool in pools:
        assert pool["spec"]["targetPorts"] == [{"number": 8100}]
        wanted = pool["spec"]["selector"]["matchLabels"]
        matched = [lab for lab in engine_labels if wanted.items() <= lab.items()]
        assert len(matched) == 1, pool["metadata"]["name"]
    routed = {
        ref["name"]
        for route in of_kind(docs, "HTTPRoute")
        for rule in route["spec"]["rules"]
        for ref in rule["backendRefs"]
        if ref["kind"] == "InferencePool"
    }
    assert routed == {p["metadata"]["name"] for p in pools}
    services = {d["metadata"]["name"]: d for d in of_kind(docs, "Service")}
    pickers = [
        d
        for d in of_kind(docs, "Deployment")
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == "endpoint-picker"
    ]
    for pool in pools:
        ref = pool["spec"]["endpointPickerRef"]
        service = services[ref["name"]]
        assert ref["port"]["number"] in {p["port"] for p in service["spec"]["ports"]}
        (picker,) = [
            d
            for d in pickers
            if service["spec"]["selector"].items()
            <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        args = picker["spec"]["template"]["spec"]["containers"][0]["args"]
        assert f"--pool-name={pool['metadata']['name']}" in args
    (config,) = of_kind(docs, "ConfigMap")
    urls = config["data"]["CLOISTER_ENGINE_URLS"]
    assert "dns+http://" not in urls and "cloister-inference" in urls
    # One HTTP request per completion: a link (one WebSocket) would let the endpoint
    # picker choose once per gateway, not per request.
    assert config["data"]["CLOISTER_ENGINE_TRANSPORT"] == "http"
    (production,) = of_kind(rendered["production"], "ConfigMap")
    assert "CLOISTER_ENGINE_TRANSPORT" not in production["data"]  # the link, by default


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_config_maps_hold_settings_cloister_accepts(
    rendered: dict[str, Docs], overlay: str, tmp_path: Path
) -> None:
    from server.settings import Settings

    for config in of_kind(rendered[overlay], "ConfigMap"):
        values = {
            name.removeprefix("CLOISTER_").lower(): value
            for name, value in config["data"].items()
            if name.startswith("CLOISTER_")
        }
        unknown = sorted(set(values) - Settings.setting_names())
        assert not unknown, f"{config['metadata']['name']}: not settings: {unknown}"
        # Production's secrets come from the Secret; the values here must parse.
        values.update(environment="development", data_dir=str(tmp_path), key_pepper="p" * 32)
        settings = Settings(**values)
        if "forwarded_allow_ips" in values:  # the ingress's private ranges, never "*"
            assert "*" not in settings.forwarded_allow_ips
