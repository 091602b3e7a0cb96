"""deploy/: Kubernetes and KServe manifests checked against the server they run (no cluster
here): each manifest round-trips through the official Kubernetes client's models (field names,
types); env names are ServeSettings fields; the container env builds real settings on the
container port; probe paths are routes of serve.app's app; the grace period outlasts the drain
(readiness grace + in-flight timeout, also the image's within `docker stop`);
names and selectors line up; deploy/models.yaml validates as a model repository."""
from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Dict, List

import pytest
import yaml

from serve.config import ServeSettings
from tests.k8s_common import DEPLOY, round_trip

PREFIX = ServeSettings.model_config["env_prefix"]
DOCKER_STOP_TIMEOUT_S = 10  # `docker stop` without -t (the image cannot change it)


def docs(sub: str) -> Dict[str, dict]:
    """Every manifest under deploy/<sub>, by kind (one of each kind)."""
    out: Dict[str, dict] = {}
    for path in sorted((DEPLOY / sub).glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            assert doc["kind"] not in out, f"two {doc['kind']} manifests"
            out[doc["kind"]] = doc
    return out


K8S, KSERVE = docs("kubernetes"), docs("kserve")


def container(pod_spec: dict) -> dict:
    (c,) = pod_spec["containers"]
    return c


def env(c: dict) -> Dict[str, dict]:
    return {e["name"]: e for e in c["env"]}


@pytest.fixture(scope="module")
def app_paths() -> Dict[str, List[str]]:
    """Path -> methods of the real app (built with one model; nothing is loaded)."""
    from serve.app import create_app
    from serve.config import ModelConfig
    demo = Path(__file__).resolve().parents[1] / "irpe" / "demo" / "deit_shapes_irpe.safetensors"
    app = create_app(ServeSettings(models=[ModelConfig(name="m", path=demo)]))
    return {p: list(ops) for p, ops in app.openapi()["paths"].items()}


def _containers():
    dep = container(K8S["Deployment"]["spec"]["template"]["spec"])
    return [("deployment", dep), ("servingruntime", container(KSERVE["ServingRuntime"]["spec"]))]


@pytest.mark.parametrize("where,c", _containers())
def test_env_names_are_settings_fields(where, c):
    fields = set(ServeSettings.model_fields)
    for name in env(c):
        assert name.startswith(PREFIX), f"{where}: {name} is not an {PREFIX}* variable"
        assert name[len(PREFIX):].lower() in fields, f"{where}: {name} is no ServeSettings field"


@pytest.mark.parametrize("where,c", _containers())
def test_container_env_builds_settings_on_the_container_port(where, c, monkeypatch, tmp_path):
    """The literal env values, given to the real settings class (repository file: a copy of
    deploy/models.yaml), listen on the container port on every interface."""
    for name, item in env(c).items():
        if "value" in item:
            monkeypatch.setenv(name, item["value"])
    repo_path = Path(env(c)[PREFIX + "REPOSITORY"]["value"])
    (tmp_path / "models.yaml").write_text((DEPLOY / "models.yaml").read_text())
    monkeypatch.setenv(PREFIX + "REPOSITORY", str(tmp_path / "models.yaml"))
    settings = ServeSettings()
    (port,) = c["ports"]
    assert settings.port == port["containerPort"] and settings.host == "0.0.0.0"
    assert [m.name for m in settings.models] == ["deit_shapes_irpe", "detr_shapes_irpe"]
    assert all(m.path.parent == tmp_path for m in settings.models)  # relative to the file
    mounts = {m["mountPath"] for m in c.get("volumeMounts", [])} or {"/mnt/models"}  # KServe
    assert str(repo_path.parent) in mounts


@pytest.mark.parametrize("where,c", _containers())
def test_probes_are_routes_of_the_app(where, c, app_paths):
    (port,) = c["ports"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        if probe in c:
            get = c[probe]["httpGet"]
            assert "get" in app_paths[get["path"]], get["path"]
            assert get["port"] in (port["containerPort"], port.get("name"))
    assert "/metrics" in app_paths


@pytest.mark.parametrize("where,c", _containers())
def test_one_gpu_per_replica(where, c):
    limits, requests = c["resources"]["limits"], c["resources"].get("requests", {})
    assert limits["nvidia.com/gpu"] == "1"  # quantities are strings in the API schema
    assert requests.get("nvidia.com/gpu", "1") == "1"  # extended resources: request == limit


def _drain_s(values: Dict[str, str]) -> float:
    """Seconds `irpe serve` may take from SIGTERM to exit under these IRPE_SERVE_* values: the
    readiness-503 grace, then the in-flight timeout (serve.drain), as the settings parse them."""
    settings = ServeSettings(drain_grace_s=values[PREFIX + "DRAIN_GRACE_S"],
                             shutdown_timeout_s=values[PREFIX + "SHUTDOWN_TIMEOUT_S"])
    return settings.drain_grace_s + settings.shutdown_timeout_s


def _values(c: dict) -> Dict[str, str]:
    return {name: item["value"] for name, item in env(c).items() if "value" in item}


def test_grace_period_outlasts_prestop_and_drain():
    spec = K8S["Deployment"]["spec"]["template"]["spec"]
    c = container(spec)
    drain = _drain_s(_values(c))
    assert float(_values(c)[PREFIX + "DRAIN_GRACE_S"]) > 0  # load balancers see the 503
    command = c["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    grace = spec["terminationGracePeriodSeconds"]
    assert grace > float(command[1]) + drain
    live = c["livenessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] > grace  # no kill while draining


def test_kserve_drain_fits_the_default_grace_period():
    """KServe's pods keep Kubernetes' default terminationGracePeriodSeconds (30 s)."""
    predictor = KSERVE["InferenceService"]["spec"]["predictor"]
    grace = predictor.get("terminationGracePeriodSeconds", 30)
    assert _drain_s(_values(container(KSERVE["ServingRuntime"]["spec"]))) < grace


def test_image_drain_fits_docker_stop():
    """The Dockerfile's drain settings end before `docker stop`'s default 10 s (then SIGKILL)."""
    text = (DEPLOY.parent / "Dockerfile").read_text()
    values = dict(re.findall(r"\b(IRPE_SERVE_[A-Z_]+)=(\S+)", text))
    assert float(values[PREFIX + "DRAIN_GRACE_S"]) > 0
    assert _drain_s(values) < DOCKER_STOP_TIMEOUT_S - 1  # a second left for the models' stop


def test_names_selectors_and_volumes_line_up():
    dep, svc, hpa, pvc = (K8S[k] for k in ("Deployment", "Service", "HorizontalPodAutoscaler",
                                           "PersistentVolumeClaim"))
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert svc["spec"]["selector"].items() <= labels.items()
    c = container(dep["spec"]["template"]["spec"])
    (port,) = c["ports"]
    assert svc["spec"]["ports"][0]["targetPort"] in (port["name"], port["containerPort"])
    ref = hpa["spec"]["scaleTargetRef"]
    assert (ref["apiVersion"], ref["kind"], ref["name"]) == \
        (dep["apiVersion"], "Deployment", dep["metadata"]["name"])
    assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    assert hpa["spec"]["metrics"][0]["resource"]["name"] in c["resources"]["requests"]
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    for mount in c["volumeMounts"]:
        claim = volumes[mount["name"]]["persistentVolumeClaim"]["claimName"]
        assert claim == pvc["metadata"]["name"] and mount["readOnly"]
    kustomize = yaml.safe_load((DEPLOY / "kubernetes" / "kustomization.yaml").read_text())
    files = sorted(p.name for p in (DEPLOY / "kubernetes").glob("*.yaml"))
    assert sorted(kustomize["resources"]) == [f for f in files if f != "kustomization.yaml"]
    assert kustomize["images"][0]["name"] == c["image"]


def test_kserve_inference_service_uses_the_runtime_with_v2():
    isvc, runtime = KSERVE["InferenceService"], KSERVE["ServingRuntime"]
    model = isvc["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["protocolVersion"] == "v2" and "v2" in runtime["spec"]["protocolVersions"]
    assert model["modelFormat"] in [{k: f[k] for k in ("name", "version")}
                                    for f in runtime["spec"]["supportedModelFormats"]]
    assert model["storageUri"] == "pvc://" + K8S["PersistentVolumeClaim"]["metadata"]["name"] + "/"
    assert container(runtime["spec"])["name"] == "kserve-container"
    assert model["resources"]["limits"]["nvidia.com/gpu"] == "1"


# kind -> model class of the official Kubernetes client (its models check names and types)
K8S_MODELS = {"Deployment": "V1Deployment", "Service": "V1Service",
              "HorizontalPodAutoscaler": "V2HorizontalPodAutoscaler",
              "PersistentVolumeClaim": "V1PersistentVolumeClaim"}


@pytest.mark.parametrize("kind", sorted(K8S_MODELS))
def test_manifests_fit_the_kubernetes_api_schema(kind):
    assert round_trip(K8S[kind], K8S_MODELS[kind]) == K8S[kind]


def test_kserve_containers_fit_the_container_schema():
    """KServe's own CRDs are not in the client; their pod parts are core Container specs."""
    c = container(KSERVE["ServingRuntime"]["spec"])
    assert round_trip(c, "V1Container") == c
    resources = KSERVE["InferenceService"]["spec"]["predictor"]["model"]["resources"]
    assert round_trip(resources, "V1ResourceRequirements") == resources


def test_schema_check_catches_a_misspelt_field():
    doc = copy.deepcopy(K8S["Deployment"])
    container(doc["spec"]["template"]["spec"])["livenessProbe"]["failureTreshold"] = 3
    assert round_trip(doc, "V1Deployment") != doc


def test_a_wrong_env_name_is_caught(tmp_path):
    """The field check is not vacuous: a misspelt variable fails it."""
    bad = {"name": "server", "env": [{"name": PREFIX + "SHUTDOWN_TIMEOUT", "value": "30"}]}
    with pytest.raises(AssertionError, match="no ServeSettings field"):
        test_env_names_are_settings_fields("bad", bad)
