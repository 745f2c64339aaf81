"""deploy/: Kubernetes manifests validated offline against the bundled schemas (kubernetes-validate), the
kustomize overlays rendered (tests/support/kustomize.py, no binary needed) and validated the same way, the properties the
deployment depends on asserted, Dockerfiles and the compose file linted (no docker here)."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import httpx
import kubernetes_validate
import pytest
import yaml

from tests.support.kustomize import KustomizeError, render

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
K8S_VERSION = "1.34"  # the oldest release with resource.k8s.io/v1 (DRA) and native sidecars both GA
MANIFESTS = sorted(p for p in (DEPLOY / "k8s").rglob("*.yaml") if p.name != "kustomization.yaml")
OVERLAYS = sorted(p.name for p in (DEPLOY / "k8s" / "overlays").iterdir() if (p / "kustomization.yaml").is_file())
# Prometheus operator CRDs: no schema in kubernetes-validate, so checked field by field (monitoring.coreos.com/v1)
POD_MONITOR_SPEC = {"selector", "podMetricsEndpoints", "namespaceSelector", "jobLabel", "podTargetLabels"}
POD_METRICS_ENDPOINT = {"port", "path", "interval", "scrapeTimeout", "scheme", "honorLabels", "relabelings"}


def documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def load(relative: str, kind: str) -> dict:
    (doc,) = [d for d in documents(DEPLOY / "k8s" / relative) if d["kind"] == kind]
    return doc


def pod_spec(deployment: dict) -> dict:
    return deployment["spec"]["template"]["spec"]


def containers(spec: dict) -> dict[str, dict]:
    return {c["name"]: c for c in spec.get("initContainers", []) + spec["containers"]}


def env(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", [])}


def image_ok(image: str) -> bool:
    """Pinned: a tag (or digest) that is not `latest`."""
    name = image.rpartition("/")[2]
    return "@sha256:" in image or (":" in name and not name.endswith(":latest"))


DEPLOYMENTS = {
    "sidecar-dra": ("sidecar/deployment.yaml", "mmproc"),
    "sidecar-timeslicing": ("sidecar/timeslicing/deployment.yaml", "mmproc"),
    "pool": ("pool/deployment.yaml", "mmproc"),
}


# -- schema ----------------------------------------------------------------------------------------------


def validate(doc: dict) -> None:
    if doc["kind"] == "PodMonitor":
        assert doc["apiVersion"] == "monitoring.coreos.com/v1"
        assert set(doc) <= {"apiVersion", "kind", "metadata", "spec"} and set(doc["spec"]) <= POD_MONITOR_SPEC
        assert doc["spec"]["podMetricsEndpoints"] and doc["spec"]["selector"]["matchLabels"]
        for endpoint in doc["spec"]["podMetricsEndpoints"]:
            assert set(endpoint) <= POD_METRICS_ENDPOINT and isinstance(endpoint["port"], str)
        return
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)  # unknown fields fail too


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_manifest_is_valid_kubernetes(path: Path) -> None:
    for doc in documents(path):
        validate(doc)


def test_the_validator_catches_mistakes() -> None:
    deployment = load("sidecar/deployment.yaml", "Deployment")
    typo = copy.deepcopy(deployment)
    pod_spec(typo)["shareProcessNamespce"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(typo, K8S_VERSION, strict=True)


# -- the sidecar -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["sidecar-dra", "sidecar-timeslicing"])
def test_sidecar_shares_pid_namespace_socket_and_gpu(variant: str) -> None:
    spec = pod_spec(load(DEPLOYMENTS[variant][0], "Deployment"))
    assert spec["shareProcessNamespace"] is True
    (sidecar,) = spec["initContainers"]
    assert sidecar["name"] == "mmproc" and sidecar["restartPolicy"] == "Always"  # native sidecar
    (llm,) = spec["containers"]

    address = env(sidecar)["MMPROC_GRPC_ADDRESS"]
    assert address.startswith("unix:")
    socket_dir = str(Path(address.removeprefix("unix:")).parent)
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = [{m["mountPath"]: m["name"] for m in c["volumeMounts"]} for c in (sidecar, llm)]
    assert mounts[0].get(socket_dir) == mounts[1].get(socket_dir) is not None
    assert "emptyDir" in volumes[mounts[0][socket_dir]]
    assert env(llm)["MMPROC_TARGET"] == address

    if variant == "sidecar-dra":
        claims = {c["name"]: c for c in spec["resourceClaims"]}
        template = load("sidecar/resourceclaimtemplate.yaml", "ResourceClaimTemplate")
        for container in (sidecar, llm):  # the same claim, so the same GPU
            (claim,) = container["resources"]["claims"]
            assert claims[claim["name"]]["resourceClaimTemplateName"] == template["metadata"]["name"]
    else:
        for container in (sidecar, llm):
            assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert spec["nodeSelector"]["nvidia.com/gpu.count"] == "1"


@pytest.mark.parametrize("variant", sorted(DEPLOYMENTS))
def test_probes_use_numeric_ports_and_drain_fits_the_grace_period(variant: str) -> None:
    path, name = DEPLOYMENTS[variant]
    spec = pod_spec(load(path, "Deployment"))
    for container in containers(spec).values():
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            for handler in (container.get(probe) or {}).values():
                if isinstance(handler, dict) and "port" in handler:
                    assert isinstance(handler["port"], int), f"{container['name']} {probe}"
    mmproc = containers(spec)[name]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert probe in mmproc, probe
    grace = float(env(mmproc)["MMPROC_GRACE_PERIOD_S"])
    assert spec["terminationGracePeriodSeconds"] >= grace + 5  # drain, then unload, before SIGKILL
    assert 1 <= float(env(mmproc).get("MMPROC_DRAIN_DELAY_S", 5)) <= grace  # endpoints drop the pod first
    assert spec["enableServiceLinks"] is False


@pytest.mark.parametrize("variant", sorted(DEPLOYMENTS))
def test_pods_run_as_non_root_with_pinned_images(variant: str) -> None:
    spec = pod_spec(load(DEPLOYMENTS[variant][0], "Deployment"))
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    for container in containers(spec).values():
        assert image_ok(container["image"]), container["image"]
        assert container["securityContext"]["allowPrivilegeEscalation"] is False


# -- the pool --------------------------------------------------------------------------------------------


def test_pool_is_headless_serialized_and_probed_over_grpc() -> None:
    deployment = load("pool/deployment.yaml", "Deployment")
    service = load("pool/service.yaml", "Service")
    (mmproc,) = pod_spec(deployment)["containers"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    container_ports = {p["name"]: p["containerPort"] for p in mmproc["ports"]}
    for port in service["spec"]["ports"]:
        assert port["targetPort"] == container_ports[port["name"]]
    assert env(mmproc)["MMPROC_TRANSPORT"] == "serialized"
    assert env(mmproc)["MMPROC_GRPC_ADDRESS"].endswith(f":{container_ports['grpc']}")
    assert mmproc["readinessProbe"]["grpc"]["port"] == container_ports["grpc"]


def test_hpa_scales_the_pool_on_a_metric_the_service_exports(tiny_server) -> None:
    hpa = load("pool/hpa.yaml", "HorizontalPodAutoscaler")
    deployment = load("pool/deployment.yaml", "Deployment")
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    (metric,) = hpa["spec"]["metrics"]
    name = metric["pods"]["metric"]["name"]
    exported = httpx.get(f"{tiny_server.http_url}/metrics").text
    assert re.search(rf"^# TYPE {name} gauge$", exported, re.MULTILINE), f"{name} is not exported"
    rules = yaml.safe_load(load("pool/prometheus-adapter-rules.yaml", "ConfigMap")["data"]["config.yaml"])
    assert any(rule["name"]["as"] == name and name in rule["seriesQuery"] for rule in rules["rules"])


# -- images and compose ----------------------------------------------------------------------------------


def dockerfile(name: str) -> tuple[list[str], dict[str, str]]:
    """(instructions with continuations joined, ARG defaults)."""
    text = (DEPLOY / name).read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    args = dict(re.findall(r"^ARG (\w+)=(\S*)$", "\n".join(lines), re.MULTILINE))
    return lines, args


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.cpu"])
def test_dockerfile_runs_non_root_with_a_healthcheck_and_pinned_bases(name: str) -> None:
    lines, args = dockerfile(name)
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    (healthcheck,) = [line for line in lines if line.startswith("HEALTHCHECK ")]
    assert '"mmproc", "health"' in healthcheck
    for line in lines:
        if line.startswith("FROM "):
            image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], line.split()[1])
            assert image == "build" or image_ok(image), image
    assert any("MMPROC_GRPC_ADDRESS=0.0.0.0:" in line for line in lines)  # reachable from outside


def test_compose_shares_the_gpu_socket_and_pid_namespace() -> None:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    mmproc, llm = compose["services"]["mmproc"], compose["services"]["llm"]
    assert llm["pid"] == "service:mmproc" and llm["ipc"] == "service:mmproc"
    socket_dir = str(Path(mmproc["environment"]["MMPROC_GRPC_ADDRESS"].removeprefix("unix:")).parent)
    assert f"mmproc-socket:{socket_dir}" in mmproc["volumes"] and f"mmproc-socket:{socket_dir}" in llm["volumes"]
    assert mmproc["user"] == llm["user"] != "0"
    assert mmproc["healthcheck"]["test"] == ["CMD", "mmproc", "health"]
    gpus = [s["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] for s in (mmproc, llm)]
    assert gpus[0] == gpus[1]
    for service in (mmproc, llm):
        assert image_ok(service["image"]), service["image"]


def test_engine_image_installs_pinned_vllm_and_mmproc_and_runs_non_root() -> None:
    lines, args = dockerfile("Dockerfile.vllm")
    assert re.fullmatch(r"\d+\.\d+\.\d+", args["VLLM_VERSION"])
    assert any('"vllm==${VLLM_VERSION}"' in line for line in lines)
    assert any(line.startswith("RUN pip install") and "/src" in line for line in lines)  # mmproc's connector
    (base,) = [line.split()[1] for line in lines if line.startswith("FROM ")]
    assert image_ok(re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base))
    assert [line.split()[1] for line in lines if line.startswith("USER ")][-1] == "10001:10001"


@pytest.mark.parametrize("variant", ["sidecar-dra", "sidecar-timeslicing"])
def test_engine_container_loads_the_mmproc_connector_from_the_shared_socket(variant: str) -> None:
    import json

    spec = pod_spec(load(DEPLOYMENTS[variant][0], "Deployment"))
    (llm,) = spec["containers"]
    assert llm["image"] == "registry.example.com/mmproc-vllm:0.1.0" and llm["command"] == ["vllm", "serve"]
    (flag,) = [a for a in llm["args"] if a.startswith("--ec-transfer-config=")]
    config = json.loads(flag.partition("=")[2])
    assert config["ec_connector"] == "MmprocECConnector" and config["ec_role"] == "ec_consumer"
    assert config["ec_connector_module_path"] == "mmproc.engines.vllm"
    assert config["ec_connector_extra_config"]["target"] == env(llm)["MMPROC_TARGET"]
    import mmproc.engines  # the module path names a package that exists

    assert (Path(mmproc.engines.__file__).parent / "vllm.py").is_file()


# -- topology, /dev/shm ----------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", sorted(DEPLOYMENTS))
def test_replicas_spread_and_decode_workers_get_a_memory_backed_dev_shm(variant: str) -> None:
    path, name = DEPLOYMENTS[variant]
    deployment = load(path, "Deployment")
    spec = pod_spec(deployment)
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    spreads = spec["topologySpreadConstraints"]
    assert "kubernetes.io/hostname" in {c["topologyKey"] for c in spreads}
    for constraint in spreads:
        assert constraint["labelSelector"]["matchLabels"].items() <= labels.items()
    mounts = {m["mountPath"]: m["name"] for m in containers(spec)[name]["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"  # not the runtime's 64 MiB default


# -- kustomize overlays ----------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_to_valid_manifests_with_its_parameters(overlay: str) -> None:
    docs = render(DEPLOY / "k8s" / "overlays" / overlay)
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "PodMonitor", "NetworkPolicy"} <= kinds
    for doc in docs:
        validate(doc)
        assert doc["metadata"]["namespace"] == "vlm", doc["metadata"]["name"]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    spec = pod_spec(deployment)
    for container in containers(spec).values():
        assert container["image"].startswith("registry.example.com/ml/") and image_ok(container["image"])
    (models,) = [v for v in spec["volumes"] if v["name"] == "models"]
    assert models["persistentVolumeClaim"]["claimName"] != "kimi-vl-weights"  # the overlay's own volume


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_pod_monitor_scrapes_mmproc_and_the_network_policy_guards_it(overlay: str) -> None:
    docs = render(DEPLOY / "k8s" / "overlays" / overlay)
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (monitor,) = [d for d in docs if d["kind"] == "PodMonitor"]
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    spec = pod_spec(deployment)
    mmproc = containers(spec)["mmproc"]
    named = {p["name"]: p["containerPort"] for c in containers(spec).values() for p in c.get("ports", [])}
    assert len(named) == sum(len(c.get("ports", [])) for c in containers(spec).values())  # unique in the pod
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    http_port = int(env(mmproc)["MMPROC_HTTP_ADDRESS"].rpartition(":")[2])
    assert named[endpoint["port"]] == http_port and endpoint["path"] == "/metrics"
    # mmproc's HTTP port (which also serves /v1/encode) is reachable from the monitoring namespace only
    (http_rule,) = [r for r in policy["spec"]["ingress"] if {p["port"] for p in r["ports"]} == {http_port}]
    (source,) = http_rule["from"]
    assert source == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    if env(mmproc)["MMPROC_GRPC_ADDRESS"].startswith("unix:"):
        return  # the sidecar's gRPC is a socket in the pod
    grpc_port = int(env(mmproc)["MMPROC_GRPC_ADDRESS"].rpartition(":")[2])
    (grpc_rule,) = [r for r in policy["spec"]["ingress"] if {p["port"] for p in r["ports"]} == {grpc_port}]
    assert grpc_rule["from"][0]["podSelector"]["matchLabels"] == {"mmproc.io/client": "true"}


def test_the_renderer_refuses_what_it_does_not_implement(tmp_path: Path) -> None:
    base = tmp_path / "base"
    base.mkdir()
    (base / "cm.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\ndata:\n  a: b\n")
    (base / "kustomization.yaml").write_text("resources: [cm.yaml]\ncommonLabels: {a: b}\n")
    with pytest.raises(KustomizeError, match="commonLabels"):
        render(base)
    (base / "kustomization.yaml").write_text("resources: [cm.yaml]\n")
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    failing = "- op: test\n  path: /data/a\n  value: c\n"
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": ["../base"], "patches": [{"target": {"kind": "ConfigMap", "name": "x"}, "patch": failing}],
    }))  # fmt: skip
    with pytest.raises(KustomizeError, match="test failed"):
        render(overlay)
    (overlay / "kustomization.yaml").write_text("resources: [../base/cm.yaml]\n")
    with pytest.raises(KustomizeError, match="outside"):
        render(overlay)


def test_the_two_node_nixl_layout_opens_exactly_the_ports_it_listens_on() -> None:
    """deploy/k8s/xnode: the pool serves NIXL on its pod interface within a port range, and the NetworkPolicies
    open that range both ways (pool <- workers, workers <- pool) and gRPC only to the workers."""
    mmproc = containers(pod_spec(load("xnode/deployment.yaml", "Deployment")))["mmproc"]
    values = env(mmproc)
    assert values["MMPROC_NIXL"] == "true" and values["MMPROC_NIXL_NET_DEVICES"] == "eth0"
    low, high = (int(p) for p in values["MMPROC_NIXL_PORT_RANGE"].split("-"))
    policies = {d["metadata"]["name"]: d for d in documents(DEPLOY / "k8s" / "xnode" / "networkpolicy.yaml")}
    ranges = []
    for policy in policies.values():
        for rule in policy["spec"]["ingress"]:
            ranges += [(p["port"], p.get("endPort")) for p in rule["ports"] if p.get("endPort")]
    assert ranges == [(low, high), (low, high)]
    pool_ingress = policies["mmproc-pool-nixl"]["spec"]["ingress"][0]
    assert pool_ingress["from"][0]["podSelector"]["matchLabels"] == {"mmproc.io/client": "true"}
    assert {p["port"] for p in pool_ingress["ports"]} == {50051, low}
