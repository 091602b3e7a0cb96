"""deploy/kuberay/rayservice.yaml checked against what runs it (no Kubernetes cluster here):
its serveConfigV2 against Ray Serve's own config schema and the project's builder, its args
as the Launch `irpe serve --ray-config` writes, the repository it names (deploy/models.yaml,
on the volume both pod groups mount) with a ray: section the GPU workers can place, the pod
templates through the Kubernetes client's models, and RayService's own field names (KubeRay's
830 KB CRD is not vendored: its spec keys are listed here from ray.io/v1)."""
from __future__ import annotations

from pathlib import PurePosixPath

import pytest
import yaml

from serve.config import ServeSettings
from serve.launch import Launch
from serve.ray_config import BUILDER
from serve.repository import read_repository
from tests.k8s_common import DEPLOY, round_trip

SERVICE = yaml.safe_load((DEPLOY / "kuberay" / "rayservice.yaml").read_text())
CLUSTER = SERVICE["spec"]["rayClusterConfig"]
GROUPS = {"head": CLUSTER["headGroupSpec"], **{g["groupName"]: g
                                               for g in CLUSTER["workerGroupSpecs"]}}
# RayService (ray.io/v1) field names, from KubeRay's CRD
SPEC_KEYS = {"serveConfigV2", "rayClusterConfig", "upgradeStrategy", "serveService",
             "serviceUnhealthySecondThreshold", "deploymentUnhealthySecondThreshold",
             "excludeHeadPodFromServeSvc"}
CLUSTER_KEYS = {"rayVersion", "enableInTreeAutoscaling", "autoscalerOptions", "headGroupSpec",
                "workerGroupSpecs", "headServiceAnnotations", "suspend", "managedBy",
                "gcsFaultToleranceOptions"}
HEAD_KEYS = {"rayStartParams", "template", "serviceType", "headService", "enableIngress"}
WORKER_KEYS = {"groupName", "replicas", "minReplicas", "maxReplicas", "rayStartParams",
               "template", "numOfHosts", "scaleStrategy", "suspend", "idleTimeoutSeconds"}


def serve_config() -> dict:
    return yaml.safe_load(SERVICE["spec"]["serveConfigV2"])


def test_rayservice_uses_kuberay_field_names():
    assert SERVICE["apiVersion"] == "ray.io/v1" and SERVICE["kind"] == "RayService"
    assert set(SERVICE["spec"]) <= SPEC_KEYS and set(CLUSTER) <= CLUSTER_KEYS
    assert set(GROUPS["head"]) <= HEAD_KEYS
    for group in CLUSTER["workerGroupSpecs"]:
        assert set(group) <= WORKER_KEYS
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
    for group in GROUPS.values():  # KubeRay passes them to `ray start` as strings
        assert all(isinstance(v, str) for v in group["rayStartParams"].values())


def test_serve_config_is_rays_schema_and_our_builder():
    schema = pytest.importorskip("ray.serve.schema")
    import ray
    config = schema.ServeDeploySchema.model_validate(serve_config())
    (app,) = config.applications
    assert app.import_path == BUILDER and config.http_options.port == 8000
    assert CLUSTER["rayVersion"] == ray.__version__  # the version the tests ran
    launch = Launch.model_validate(app.args)
    mount = {m["mountPath"] for g in GROUPS.values()
             for c in g["template"]["spec"]["containers"] for m in c["volumeMounts"]}
    assert {str(PurePosixPath(launch.repository).parent)} == mount == {"/models"}


def test_the_repository_fits_the_gpu_workers():
    """deploy/models.yaml is that repository: its ray: section validates, asks for GPUs for
    its cuda models, and one replica fits a worker pod."""
    settings = ServeSettings.model_validate(read_repository(DEPLOY / "models.yaml"))
    ray = settings.ray
    assert any(m.device.startswith("cuda") for m in settings.models) and ray.num_gpus > 0
    worker = GROUPS["gpu"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert float(worker["nvidia.com/gpu"]) >= ray.num_gpus
    assert float(worker["cpu"]) >= ray.num_cpus
    assert ray.autoscaling is not None
    per_pod = int(float(worker["nvidia.com/gpu"]) // ray.num_gpus)
    assert GROUPS["gpu"]["maxReplicas"] * per_pod >= ray.autoscaling.max_replicas


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_pod_templates_fit_the_kubernetes_api_schema(group):
    template = GROUPS[group]["template"]
    assert round_trip(template, "V1PodTemplateSpec") == template
    volumes = {v["persistentVolumeClaim"]["claimName"] for v in template["spec"]["volumes"]}
    assert volumes == {"irpe-models"}  # deploy/kubernetes/pvc.yaml
