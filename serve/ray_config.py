"""``irpe serve --ray-config FILE``: the server as a Ray Serve config file.

The file is what Ray's own tools take (``serve run FILE``, ``serve deploy FILE``, a KubeRay
RayService's ``serveConfigV2``): one application whose ``import_path`` is
:func:`serve.ray_app.build` and whose ``args`` are the :class:`serve.launch.Launch` of this
command. The replicas' options are not copied into it: the builder reads them from the
repository's ``ray:`` section on the cluster, so the repository stays their one source (a
``deployments:`` entry added by hand wins, as Ray documents). Settings from ``IRPE_SERVE_*``
variables (models included) are written into ``args`` (:meth:`Launch.with_environment`), so the
file serves what this command resolved wherever it runs; the bearer token is not (a secret): the
cluster sets its own ``IRPE_SERVE_AUTH_TOKEN``, and the file says so.

The file is never written over anything the server reads (irpe.outputs): the repository file
and every file its models name (the artifact with its companions, an IR's ``.bin``, an
engine's sidecar; labels, metadata, libraries).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import yaml

from irpe.atomic import write_text
from irpe.outputs import check_outputs

from .config import ServeSettings
from .launch import Launch
from .settings_env import env_variable_set

__all__ = ["BUILDER", "serve_config", "served_files", "write_serve_config"]

BUILDER = "serve.ray_app:build"  # the import path the cluster's Python resolves


def serve_config(launch: Launch, settings: ServeSettings) -> Dict[str, Any]:
    """Ray Serve's config (its ServeDeploySchema) for ``launch``: HTTP on the settings' host
    and port, the proxy where ``ray.proxy_location`` says."""
    ray = settings.ray
    return {
        "proxy_location": ray.proxy_location,
        "http_options": {"host": settings.host, "port": settings.port},
        "applications": [{
            "name": ray.application,
            "route_prefix": ray.route_prefix,
            "import_path": BUILDER,
            "args": launch.model_dump(exclude_defaults=True),
        }],
    }


def served_files(settings: ServeSettings) -> List[Path]:
    """The files the server reads for its models: each model's artifact, metadata, labels
    file and libraries, and the server's default libraries (companions are added by
    :func:`irpe.outputs.check_outputs`)."""
    files: List[Optional[Path]] = [settings.repository, settings.ort_ops_library,
                                   settings.ov_ops_library]
    for model in settings.models:
        labels = model.labels if isinstance(model.labels, Path) else None
        files += [model.path, model.metadata, labels, model.ort_ops_library,
                  model.ov_ops_library, *model.plugins]
    return [path for path in files if path is not None]


def _token_note() -> str:
    """A comment where the bearer token came from a variable, which the file does not hold."""
    variable = env_variable_set("auth_token")
    if variable is None:
        return ""
    return (f"# {variable} is set where this was written but not written here (a secret):\n"
            f"#   set {variable} on the cluster (e.g. runtime_env env_vars)\n")


def write_serve_config(target: str, launch: Launch, settings: ServeSettings) -> int:
    """Write :func:`serve_config` as YAML to ``target`` (atomically; ``-``: stdout); refused
    before anything is written where ``target`` is a file the server reads or a folder."""
    if target != "-":
        check_outputs([target], [launch.repository, *served_files(settings)])
    text = ("# Ray Serve config of irpe serve (irpe serve --ray-config); run it with\n"
            "#   serve run FILE   or   serve deploy FILE   (the cluster needs\n"
            "#   pip install 'irpe-deploy[ray]' and the model files at these paths)\n"
            + _token_note() + yaml.safe_dump(serve_config(launch, settings), sort_keys=False))
    if target == "-":
        sys.stdout.write(text)
        return 0
    path = Path(target)
    write_text(path, text)
    print(f"wrote {path} (serve run {path})")
    return 0
