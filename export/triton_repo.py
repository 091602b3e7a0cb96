"""Triton Inference Server model repository from an exported ONNX file or a TensorRT engine.

``DIR/<name>/config.pbtxt`` + ``DIR/<name>/1/model.onnx`` (platform ``onnxruntime_onnx``) or
``1/model.plan`` (``tensorrt_plan``). Tensor names, data types and dims are read from the ONNX
file itself (for an engine: the ONNX file it was built from), so the config cannot drift from
the graph. The config is written as text; tests parse it with Triton's own protobuf schema.
"""
from __future__ import annotations

import json
import re
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence

from irpe.artifact.contract import ENGINE_SUFFIXES, read_onnx_props, read_sidecar, sidecar_path
from irpe.artifact.triton_config import TensorInfo, model_config, onnx_io, pbtxt
from irpe.atomic import atomic_dir
from irpe.errors import InvalidInput
from irpe.outputs import check_outputs
from irpe.runtime.onnxruntime.session import default_library

if TYPE_CHECKING:
    from _typeshed import StrPath

__all__ = ["RepoOptions", "TensorInfo", "onnx_io", "write_repository", "config_text",
           "ort_library_problem", "DEFAULT_ORT_OPS", "ENGINE_SUFFIXES"]

DEFAULT_ORT_OPS = default_library()  # the checkout's build/plugins/libirpe_ort_ops.so
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
@dataclass
class RepoOptions:
    """What ``irpe triton-repo`` asks for beyond the artifacts."""

    name: Optional[str] = None
    max_batch_size: Optional[int] = None
    max_queue_delay_us: int = 5000
    instances: int = 1
    kind: str = "gpu"
    ort_ops: str = "auto"
    trt_plugins: List[str] = field(default_factory=list)
    mount: str = "/models"
    force: bool = False


@dataclass
class _Model:
    """Everything one model directory needs, resolved before anything is written."""

    name: str
    platform: str
    artifact: Path
    inputs: List[TensorInfo]
    outputs: List[TensorInfo]
    props: Dict[str, str]
    max_batch_size: int
    libraries: List[Path]
    source: str


def write_repository(repo: StrPath, artifacts: Sequence[str],
                     options: RepoOptions) -> List[Path]:
    """Write one model directory per artifact under ``repo``; returns the model directories.

    Every artifact is resolved and checked before the first file is written; the model
    directories and README.md are built in a staging folder beside ``repo`` and moved in
    together (irpe.atomic.atomic_dir): an interrupted or failed run leaves ``repo`` as it was
    (and creates no folder). A model directory that holds one of the files read (an artifact,
    an engine's sidecar, a library) is refused before anything moves (irpe.outputs)."""
    repo = Path(repo)
    _check_target(repo, options.force)
    _check_options(options, len(artifacts))
    with tempfile.TemporaryDirectory(prefix="irpe-triton-") as scratch:
        models = [_resolve(Path(a), options, Path(scratch) / str(i))
                  for i, a in enumerate(artifacts)]
        _check_names(models)
        read = [Path(a) for a in artifacts if Path(a).is_file()]
        read += [path for m in models for path in (m.artifact, *m.libraries)]
        check_outputs([repo / "README.md"], read, [repo / m.name for m in models])
        with atomic_dir(repo, merge=True) as stage:
            staged = [_install(m, stage, options) for m in models]
            names = {m.name for m in models}
            kept = [d for d in repo.iterdir() if d.name not in names] if repo.is_dir() else []
            readme = readme_text(kept + staged, options.mount)
            (stage / "README.md").write_text(readme, encoding="utf-8")
    return [repo / m.name for m in models]


def _check_options(options: RepoOptions, count: int) -> None:
    if options.name and count != 1:
        raise InvalidInput("--name needs exactly one artifact")
    if options.kind not in ("gpu", "cpu", "auto"):
        raise InvalidInput(f"instance kind must be gpu, cpu or auto, got {options.kind!r}")
    if options.max_batch_size is not None and options.max_batch_size < 1:
        raise InvalidInput(f"--max-batch-size must be >= 1, got {options.max_batch_size}")
    if options.instances < 1 or options.max_queue_delay_us < 0:
        raise InvalidInput("--instances must be >= 1 and --max-queue-delay-us >= 0")


def _check_target(repo: Path, force: bool) -> None:
    if repo.exists() and not repo.is_dir():
        raise InvalidInput(f"{repo} exists and is not a directory")
    if repo.is_dir() and any(repo.iterdir()) and not force:
        raise InvalidInput(f"{repo} is not empty: pass --force to replace the models written "
                           "there (other entries are kept)")


def _check_names(models: List[_Model]) -> None:
    seen = set()
    for m in models:
        if not _NAME.match(m.name):
            raise InvalidInput(f"model name {m.name!r} is not a valid Triton model directory "
                               "name (letters, digits, _ . -; at most 64)")
        if m.name in seen:
            raise InvalidInput(f"two artifacts give the model name {m.name!r}: use one call "
                               "per model with --name")
        seen.add(m.name)


def _resolve(path: Path, options: RepoOptions, scratch: Path) -> _Model:
    """Read one artifact: an .onnx file, an engine (+ sidecar), or an export source."""
    if path.suffix.lower() == ".onnx":
        return _from_onnx(path, options, str(path))
    if path.suffix.lower() in ENGINE_SUFFIXES:
        return _from_engine(path, options)
    from .onnx import export_onnx  # a registered name or a trained-model .safetensors
    scratch.mkdir(parents=True, exist_ok=True)
    onnx_path = export_onnx(str(path), scratch / "model.onnx")
    return _from_onnx(Path(onnx_path), options, f"irpe export {path}")


def _from_onnx(path: Path, options: RepoOptions, source: str) -> _Model:
    props = read_onnx_props(path)  # clear errors for missing / non-ONNX files
    inputs, outputs = onnx_io(path)
    libs = _ort_library(path, props, options.ort_ops)
    batch = _batch_size(inputs, options.max_batch_size, None)
    name = options.name or props.get("irpe.model_name") or path.stem
    return _Model(name, "onnxruntime_onnx", path, inputs, outputs, props, batch, libs, source)


def _ort_library(path: Path, props: Dict[str, str], choice: str) -> List[Path]:
    """The ONNX Runtime custom-op library to reference: auto (this checkout's build, if it
    runs the file here), none, or a path (copied unchecked: it is built for the server)."""
    has_nodes = props.get("irpe.inline") != "true" and props.get("irpe.rpe_nodes", "{}") != "{}"
    if choice == "none":
        return []
    if choice != "auto":
        lib = Path(choice)
        if not lib.is_file():
            raise InvalidInput(f"ONNX Runtime custom-op library not found: {lib}")
        return [lib] if has_nodes else []
    if not (has_nodes and DEFAULT_ORT_OPS.is_file()):
        return []
    problem = ort_library_problem(path, DEFAULT_ORT_OPS)
    if problem:
        warnings.warn(f"not referencing {DEFAULT_ORT_OPS}: ONNX Runtime cannot load "
                      f"{path.name} with it ({problem}); the file's local functions run instead",
                      stacklevel=2)
        return []
    return [DEFAULT_ORT_OPS]


def ort_library_problem(model: Path, lib: Path) -> Optional[str]:
    """Why ONNX Runtime (CPU) cannot create a session for ``model`` with ``lib``, or None."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    try:
        options.register_custom_ops_library(str(lib))
        ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # any load failure means: do not reference this build
        return str(exc).strip().splitlines()[0][:300]
    return None


def _from_engine(path: Path, options: RepoOptions) -> _Model:
    from irpe.artifact.filecheck import check_file
    check_file(path, "engine")
    side = _sidecar(path)
    module = side.get("tensorrt_module", "")
    if not module.startswith("tensorrt") or "rtx" in module:
        raise InvalidInput(f"{path} was built with {module or 'an unknown module'} "
                           f"{side.get('tensorrt_version', '')}: Triton's tensorrt_plan backend "
                           "loads engines built by full TensorRT of the server's version only")
    if options.kind == "cpu":
        raise InvalidInput("a TensorRT plan needs GPU instances: drop --kind cpu")
    onnx_path = _engine_onnx(path, side)
    inputs, outputs = onnx_io(onnx_path)
    batch = _batch_size(inputs, options.max_batch_size, _profile_max_batch(side, inputs))
    libs = _plugin_libraries(path, side, options.trt_plugins)
    props = side.get("onnx_metadata") or {}
    name = options.name or props.get("irpe.model_name") or path.stem
    return _Model(name, "tensorrt_plan", path, inputs, outputs, props, batch, libs, str(path))


def _sidecar(path: Path) -> Dict:
    try:
        return read_sidecar(path)
    except FileNotFoundError:
        raise InvalidInput(f"no sidecar {sidecar_path(path)}: build the engine with `irpe "
                           "build-engine`, which records the ONNX file, profiles and plugin use "
                           "beside it") from None


def _engine_onnx(path: Path, side: Dict) -> Path:
    """The ONNX file the engine was built from (named in the sidecar, else beside it)."""
    for candidate in (side.get("onnx"), path.with_suffix(".onnx")):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    raise InvalidInput(f"the ONNX file of {path} ({side.get('onnx')}) is missing: its inputs and "
                       "outputs are needed for config.pbtxt")


def _profile_max_batch(side: Dict, inputs: List[TensorInfo]) -> Optional[int]:
    profiles = side.get("profiles") or {}
    for t in inputs:
        if t.name in profiles:
            return int(profiles[t.name][2][0])  # (min, opt, max) shapes; batch is axis 0
    return None


def _plugin_libraries(path: Path, side: Dict, given: Sequence[str]) -> List[Path]:
    """The TensorRT plugin library the engine needs, or an error when it has none."""
    for lib in given:
        if not Path(lib).is_file():
            raise InvalidInput(f"TensorRT plugin library not found: {lib}")
    if given:
        return [Path(p) for p in given]
    layers = side.get("plugin_layers") or []
    if not layers:
        return []
    found = [Path(p) for p in side.get("plugin_libraries") or [] if Path(p).is_file()]
    if not found:
        raise InvalidInput(f"{path} runs {len(layers)} iRPE plugin layers but its plugin library "
                           f"({', '.join(side.get('plugin_libraries') or []) or 'none recorded'})"
                           " is not here: pass --trt-plugin LIB (plugins/build.sh builds it)")
    return found


def _batch_size(inputs: List[TensorInfo], wanted: Optional[int], limit: Optional[int]) -> int:
    """max_batch_size: 0 when the first axis is not a dynamic batch; else wanted or default."""
    if not inputs or not all(t.batch_dynamic for t in inputs):
        if wanted:
            raise InvalidInput("--max-batch-size needs a model with a dynamic batch axis")
        return 0
    if limit is not None and wanted is not None and wanted > limit:
        raise InvalidInput(f"--max-batch-size {wanted} exceeds the engine's profile maximum "
                           f"{limit}")
    return wanted or limit or 8


def _install(model: _Model, stage: Path, options: RepoOptions) -> Path:
    """Copy artifact, libraries and labels into ``stage/<name>`` and write config.pbtxt."""
    work = stage / model.name
    (work / "1").mkdir(parents=True)
    filename = "model.onnx" if model.platform == "onnxruntime_onnx" else "model.plan"
    shutil.copyfile(model.artifact, work / "1" / filename)
    for lib in model.libraries:
        shutil.copyfile(lib, work / lib.name)
    labels = _labels(model)
    if labels:
        (work / "labels.txt").write_text("\n".join(labels) + "\n", encoding="utf-8")
    (work / "config.pbtxt").write_text(config_text(model, options, bool(labels)),
                                       encoding="utf-8")
    return work


def _labels(model: _Model) -> List[str]:
    """Class names for Triton's classification extension (classifiers only)."""
    if model.props.get("irpe.task") != "classification":
        return []
    names = json.loads(model.props.get("irpe.class_names") or "null") or []
    width = model.outputs[0].dims[-1] if model.outputs and model.outputs[0].dims else -1
    return [str(n) for n in names] if len(names) == width else []


def config_text(model: _Model, options: RepoOptions, labels: bool) -> str:
    """config.pbtxt (protobuf text format of Triton's ModelConfig, from
    irpe.artifact.triton_config: the same config `irpe serve` answers on /v2/models/{m}/config)."""
    lines = [f"# written by `irpe triton-repo` from {model.source}",
             f"# model {model.props.get('irpe.model_name', '?')}, task "
             f"{model.props.get('irpe.task', '?')}, iRPE "
             f"{json.loads(model.props.get('irpe.rpe_config') or '{}').get('config', 'none')}"]
    if model.platform == "tensorrt_plan" and model.libraries:
        lines.append("# start tritonserver with --backend-config=tensorrt,plugins=\""
                     + ";".join(_mounted(model, lib, options) for lib in model.libraries) + "\"")
    ops = ([_mounted(model, lib, options) for lib in model.libraries]
           if model.platform == "onnxruntime_onnx" else [])
    cfg = model_config(model.name, model.platform, model.inputs, model.outputs,
                       model.max_batch_size, options.max_queue_delay_us, options.instances,
                       options.kind, "labels.txt" if labels else None, ops)
    return "\n".join(lines + pbtxt(cfg)) + "\n"


def _mounted(model: _Model, lib: Path, options: RepoOptions) -> str:
    """Where the server sees a library copied into the model directory."""
    return f"{options.mount.rstrip('/')}/{model.name}/{lib.name}"


def readme_text(models: Sequence[Path], mount: str) -> str:
    """How to start tritonserver on the repository holding ``models`` (its entries: those with
    a config.pbtxt are model directories), plugin flags included."""
    rows, plugins = [], []
    for model in sorted((m for m in models if (m / "config.pbtxt").is_file()),
                        key=lambda m: m.name):
        text = (model / "config.pbtxt").read_text(encoding="utf-8")
        platform = re.search(r'^platform: "([^"]+)"', text, re.M)
        batch = re.search(r"^max_batch_size: (\d+)", text, re.M)
        libs = sorted(p.name for p in model.glob("*.so"))
        if platform and platform.group(1) == "tensorrt_plan":
            plugins += [f"{mount.rstrip('/')}/{model.name}/{lib}" for lib in libs]
        rows.append(f"| {model.name} | {platform.group(1) if platform else '?'} | "
                    f"{batch.group(1) if batch else '?'} | {', '.join(libs) or '-'} |")
    cmd = f"tritonserver --model-repository={mount}"
    if plugins:
        cmd += f' --backend-config=tensorrt,plugins="{";".join(plugins)}"'
    return "\n".join([
        "# Triton model repository (written by `irpe triton-repo`)", "",
        f"Mount this folder at `{mount}` and start the server with:", "",
        "```", cmd, "```", "",
        "| model | platform | max_batch_size | library |", "|---|---|---|---|", *rows, "",
        "ONNX models without a custom-op library run the iRPE nodes through the model-local",
        "functions inside the file (standard ONNX ops). TensorRT plans need the plugin library",
        "of the same TensorRT version as the server (or LD_PRELOAD it instead of the flag).", ""])
