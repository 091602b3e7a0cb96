"""The ray: section and `irpe serve --ray-config`, without a Ray cluster: settings checked,
Ray Serve's options and config file made from them (the file validated with Ray's own
ServeDeploySchema, its builder importable), bad input refused in one line with nothing
written; `--ray` without Ray installed says how to install it."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
import yaml
from pydantic import ValidationError

from serve.config import ServeSettings
from serve.launch import Launch
from serve.ray_config import serve_config
from serve.ray_settings import RayAutoscaling, RaySettings
from tests.helpers import BLOCKER, ROOT

DEMO = ROOT / "irpe" / "demo" / "deit_shapes_irpe.safetensors"


def irpe(*args: str, env: dict | None = None, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "irpe", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd, env=env)


def repository(tmp_path, ray: dict) -> str:
    path = tmp_path / "repo.yaml"
    path.write_text(yaml.safe_dump({"models": [{"name": "cls", "path": str(DEMO)}],
                                    "ray": ray}))
    return str(path)


def test_deployment_options_follow_the_ray_section():
    fixed = RaySettings(num_replicas=3, num_cpus=2, num_gpus=0.5, max_ongoing_requests=16)
    options = fixed.deployment_options(shutdown_timeout_s=12.0)
    assert options["num_replicas"] == 3 and "autoscaling_config" not in options
    assert options["ray_actor_options"] == {"num_cpus": 2.0, "num_gpus": 0.5}
    assert options["max_ongoing_requests"] == 16
    assert options["graceful_shutdown_timeout_s"] == 12.0  # the server's in-flight budget
    scaled = RaySettings(autoscaling=RayAutoscaling(min_replicas=1, max_replicas=4,
                                                    target_ongoing_requests=2))
    options = scaled.deployment_options(30.0)
    assert "num_replicas" not in options
    assert options["autoscaling_config"]["max_replicas"] == 4
    assert options["autoscaling_config"]["target_ongoing_requests"] == 2
    assert fixed.replica_threads() == 2 and RaySettings(num_cpus=0.5).replica_threads() == 1


def test_options_are_ray_serves_own():
    """Every option name and value is accepted by Ray Serve's DeploymentConfig schema."""
    pytest.importorskip("ray.serve")
    from ray.serve.config import AutoscalingConfig
    from ray.serve.schema import DeploymentSchema
    scaled = RaySettings(autoscaling=RayAutoscaling(max_replicas=3))
    options = scaled.deployment_options(30.0)
    DeploymentSchema(name="irpe", **options)
    AutoscalingConfig(**options["autoscaling_config"])
    DeploymentSchema(name="irpe", **RaySettings(num_replicas=2).deployment_options(5.0))


@pytest.mark.parametrize("ray, message", [
    ({"autoscaling": {"min_replicas": 3, "max_replicas": 2}}, "min_replicas 3 is above"),
    ({"num_replicas": 2, "autoscaling": {"max_replicas": 2}}, "exclude each other"),
    ({"num_cpus": 0}, "ray.num_cpus"),
    ({"replicas": 2}, "ray.replicas"),
    ({"proxy_location": "Everywhere"}, "ray.proxy_location"),
])
def test_bad_ray_sections_are_refused(tmp_path, ray, message):
    with pytest.raises(ValidationError, match=message.split(".")[-1]):
        ServeSettings(repository=repository(tmp_path, ray))
    repo = repository(tmp_path, ray)
    before = open(repo).read()
    for flag in (["--ray"], ["--ray-config", str(tmp_path / "serve.yaml")]):
        done = irpe("serve", repo, *flag)
        assert done.returncode == 2, done.stderr
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith("irpe serve: error: invalid settings:") and message in line
    assert not (tmp_path / "serve.yaml").exists() and open(repo).read() == before


def test_serve_config_is_a_ray_serve_config(tmp_path):
    """--ray-config writes Ray's config schema; its args are this command's Launch."""
    schema = pytest.importorskip("ray.serve.schema")
    repo = repository(tmp_path, {"application": "shapes", "route_prefix": "/irpe",
                                 "proxy_location": "HeadOnly"})
    out = tmp_path / "serve.yaml"
    done = irpe("serve", repo, "--ray-config", str(out), "--port", "8100", "--host", "0.0.0.0")
    assert done.returncode == 0, done.stderr
    assert f"wrote {out}" in done.stdout
    config = yaml.safe_load(out.read_text())
    deploy = schema.ServeDeploySchema.model_validate(config)
    (app,) = deploy.applications
    assert (app.name, app.route_prefix, app.import_path) == ("shapes", "/irpe",
                                                             "serve.ray_app:build")
    assert deploy.http_options.port == 8100 and deploy.http_options.host == "0.0.0.0"
    assert deploy.proxy_location == "HeadOnly"
    launch = Launch.model_validate(app.args)
    assert launch.repository == repo and launch.overrides["port"] == 8100
    settings = launch.settings()
    assert settings.model_names() == ["cls"] and settings.ray.application == "shapes"


def test_serve_config_to_stdout_and_never_over_the_repository(tmp_path):
    repo = repository(tmp_path, {})
    printed = irpe("serve", repo, "--ray-config", "-")
    assert printed.returncode == 0, printed.stderr
    assert yaml.safe_load(printed.stdout)["applications"][0]["args"]["repository"] == repo
    before = open(repo).read()
    done = irpe("serve", repo, "--ray-config", repo)
    assert done.returncode == 2 and "never overwritten" in done.stderr
    assert open(repo).read() == before


def test_the_builder_resolves_the_same_settings_as_irpe_serve(tmp_path):
    """serve.ray_app.build's Launch, resolved on the cluster, serves what the command would."""
    repo = repository(tmp_path, {"num_replicas": 2})
    launch = Launch(repository=repo, overrides={"threads": None, "log_format": "text"})
    assert serve_config(launch, launch.settings())["applications"][0]["args"] == {
        "repository": repo, "overrides": {"threads": None, "log_format": "text"}}
    settings = launch.settings(default_threads=3)
    assert settings.threads == 3 and settings.log_format == "text"
    assert settings.ray.num_replicas == 2
    pinned = Launch(repository=repo, overrides={"threads": 1}).settings(default_threads=3)
    assert pinned.threads == 1  # given threads win over the replica's CPUs


def test_ray_flag_without_ray_installed_says_how_to_install(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([BLOCKER, str(ROOT)]),
               IRPE_TEST_BLOCKED="ray")
    done = irpe("serve", repository(tmp_path, {}), "--ray", env=env)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "pip install 'irpe-deploy[ray]'" in line


def test_prepare_does_not_go_with_ray(tmp_path):
    done = irpe("serve", repository(tmp_path, {}), "--ray", "--prepare")
    assert done.returncode == 2 and "--prepare" in done.stderr


def test_node_env_sets_rays_flags_and_needs_haproxy(monkeypatch):
    """`ingress` becomes Ray's environment flags for the Ray irpe serve --ray starts: the
    proxy turns HAProxy off; haproxy turns it on with the binary found and the replay policy
    for a replica that closed without an answer; no binary -> one line naming the package."""
    import serve.ray_settings as rs
    assert RaySettings().node_env()["RAY_SERVE_ENABLE_HA_PROXY"] == "0"
    monkeypatch.setattr(rs.shutil, "which", lambda name, path=None: f"/opt/bin/{name}")
    env = RaySettings(ingress="haproxy").node_env()
    assert env["RAY_SERVE_ENABLE_HA_PROXY"] == env["RAY_SERVE_ENABLE_DIRECT_INGRESS"] == "1"
    assert env["RAY_SERVE_HAPROXY_BINARY_PATH"] == "/opt/bin/haproxy"
    assert "empty-response" in env["RAY_SERVE_HAPROXY_RETRY_ON"].split()
    # a stopping replica stays reachable 2 s (Ray's default 30 s delayed every stop)
    assert env["RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"] == "2"
    custom = RaySettings(ingress="haproxy", haproxy_deregister_s=0.5).node_env()
    assert custom["RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"] == "0.5"
    with pytest.raises(ValueError, match="haproxy_deregister_s"):
        RaySettings(haproxy_deregister_s=-1)
    monkeypatch.setattr(rs.shutil, "which", lambda name, path=None: None)
    from irpe.errors import MissingFile
    with pytest.raises(MissingFile, match="apt-get install haproxy"):
        RaySettings(ingress="haproxy").node_env()


def test_node_env_gives_a_starting_proxy_its_readiness_timeout():
    """Ray Serve kills a proxy that misses three readiness checks of 5 s (times its restarts):
    on a busy machine irpe serve --ray died there (ActorDiedError); the setting sets it."""
    for ingress in ("proxy", "haproxy"):
        if ingress == "haproxy" and not shutil.which("haproxy", path="/usr/sbin:/sbin:/usr/bin"):
            continue
        env = RaySettings(ingress=ingress).node_env()
        assert env["RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"] == "30"
    assert RaySettings(proxy_ready_timeout_s=90).node_env()[
        "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"] == "90"
    for bad in (0.5, 0, -1, 7200):
        with pytest.raises(ValueError, match="proxy_ready_timeout_s"):
            RaySettings(proxy_ready_timeout_s=bad)


def test_ray_on_a_port_in_use_is_one_line_before_ray_starts(tmp_path):
    """Ray's proxy would not report it: irpe serve --ray checks the port first."""
    import socket
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = irpe("serve", repository(tmp_path, {}), "--ray", "--port", str(port))
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.endswith(f"cannot listen on 127.0.0.1:{port}: Address already in use")


def test_ray_config_carries_the_models_of_the_environment(tmp_path):
    """Issue 50, defect 5: IRPE_SERVE_MODELS / IRPE_SERVE_RAY given to --ray-config are in the
    file; Ray's builder, run where the variables are unset (another folder, a clean
    environment), resolves those models (relative paths made absolute), not the demo ones;
    the bearer token is not written, and the file says so."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("IRPE_SERVE")}
    models = [{"name": "envcls", "path": os.path.relpath(DEMO, tmp_path)}]
    env = {**clean, "IRPE_SERVE_MODELS": json.dumps(models), "IRPE_SERVE_AUTH_TOKEN": "s3cret",
           "IRPE_SERVE_RAY": '{"num_replicas": 3}'}
    out = tmp_path / "serve.yaml"
    done = irpe("serve", "--ray-config", str(out), env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert "s3cret" not in text and "IRPE_SERVE_AUTH_TOKEN is set" in text
    check = ("import sys, yaml; from serve.launch import Launch\n"
             "args = yaml.safe_load(open(sys.argv[1]))['applications'][0]['args']\n"
             "s = Launch.model_validate(args).settings()\n"
             "print(s.model_names(), s.ray.num_replicas, s.models[0].path)")
    resolved = subprocess.run([sys.executable, "-c", check, str(out)], cwd=ROOT, env=clean,
                              capture_output=True, text=True, timeout=120)
    assert resolved.returncode == 0, resolved.stderr
    assert resolved.stdout.split() == ["['envcls']", "3", str(DEMO)]


@pytest.mark.parametrize("args, env, message", [
    (["--ray-address", "notahost:99999"], {}, "--ray-address: 'notahost:99999' is not a Ray"),
    ([], {"RAY_ADDRESS": "ray://h:0"}, "RAY_ADDRESS: 'ray://h:0' is not a Ray address"),
    (["--ray-address", "ray://127.0.0.1:1"], {}, "the Ray cluster at ray://127.0.0.1:1"),
    (["--ray-address", "auto"], {}, "auto: no Ray cluster runs on this machine"),
    ([], {"RAY_ADDRESS": "auto"}, "RAY_ADDRESS auto: no Ray cluster runs on this machine"),
])
def test_bad_or_unreachable_ray_addresses_are_one_line(tmp_path, args, env, message):
    """Issue 50, defect 3: an invalid address (once a hang), `auto` with no cluster (once a
    ConnectionError traceback) and an unreachable ray:// address (once 33 s and a traceback)
    are one line, exit 2, within seconds (the bound here is generous: 2 shared cores)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("IRPE_SERVE", "RAY_"))}
    repo = repository(tmp_path, {})
    started = time.monotonic()
    done = irpe("serve", repo, "--ray", "--port", "0", *args,
                env={**clean, "RAY_TMPDIR": str(tmp_path), **env})
    took = time.monotonic() - started
    err = done.stderr.strip()
    assert done.returncode == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("irpe serve: error: ") and message in err, err
    assert took < 30, took


def test_the_ray_address_setting_is_checked():
    assert RaySettings(address="ray://head.example:10001").address == "ray://head.example:10001"
    assert RaySettings(address="10.0.0.2:6379").address == "10.0.0.2:6379"
    with pytest.raises(ValidationError, match="is not a Ray address"):
        RaySettings(address="head:70000")
