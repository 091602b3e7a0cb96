"""What ``irpe tune`` tunes: MODEL_OR_REPO resolved to the model's files, task and input size.

MODEL_OR_REPO is a repository file (its one model, or ``--model NAME``; its other settings
are kept in the tuned file), an exported ``.onnx``, an OpenVINO IR ``.xml``, a trained
``.safetensors``, or a registered model name (its bundled weights, else an untrained model of
that architecture, exported to ONNX into the cache as ``irpe bench serve`` does).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from irpe.errors import CLIError, InvalidInput

__all__ = ["Target", "resolve", "backends_for"]

REPOSITORY_SUFFIXES = (".yaml", ".yml", ".toml")
# a repository model's keys the tune sets itself (the rest are kept as they are)
TUNED_KEYS = ("name", "path", "backend", "precision", "max_batch_size", "max_queue_delay_ms",
              "instances", "ov_streams", "ov_threads")


@dataclass
class Target:
    """The tuned model: ``name``, its files by kind (``onnx``, ``ir``, ``weights``), ``task``,
    input ``size``, the repository's other settings (``model_keys`` of the model, ``server``
    top-level ones), ``inputs`` (every file read: the write rule), ``demo`` (a demo model:
    the accuracy gate uses shapes by default)."""

    name: str
    files: Dict[str, Path]
    task: str
    size: int
    model_keys: Dict[str, Any] = field(default_factory=dict)
    server: Dict[str, Any] = field(default_factory=dict)
    inputs: List[Path] = field(default_factory=list)
    demo: bool = False


def resolve(spec: str, model: Optional[str], cache: Path) -> Target:
    """The :class:`Target` of MODEL_OR_REPO (``spec``); one line (CLIError) when it is none."""
    path = Path(spec)
    if path.suffix.lower() in REPOSITORY_SUFFIXES:
        return _from_repository(path, model)
    if model:
        raise CLIError("--model picks a model of a repository file; MODEL_OR_REPO is not one")
    if path.suffix.lower() in (".onnx", ".xml", ".safetensors"):
        if not path.is_file():
            raise CLIError(f"model file not found: {spec}")
        return _from_file(path, path.stem, cache)
    return _from_name(spec, cache)


def _from_name(name: str, cache: Path) -> Target:
    from benchmarks.serve_bench import weights
    from irpe.models.registry import model_info
    from serve.demo import DEMO_MODELS
    try:
        info = model_info(name)
    except (KeyError, ValueError) as exc:
        raise CLIError(f"{name!r} is neither a model file, a repository file nor a registered "
                       f"model ({exc})") from None
    target = _from_file(weights(info.name, cache), info.name, cache)
    target.demo = info.name in DEMO_MODELS
    return target


def _from_file(path: Path, name: str, cache: Path) -> Target:
    from irpe.artifact.files import file_kind, read_file_info
    kind = file_kind(str(path))
    files: Dict[str, Path] = {}
    if kind == "trained":
        from benchmarks.serve_bench import onnx_file
        from irpe.artifact.trained import read_spec
        spec = read_spec(str(path))[0]
        files = {"weights": path, "onnx": onnx_file(path, cache)}
    elif kind in ("onnx", "ir"):
        spec = read_file_info(str(path)).spec
        files = {kind: path}
    else:
        raise CLIError(f"{path}: irpe tune runs on the CPU; a {kind} file is not tunable here")
    size = int(getattr(spec.transform(), "size", 0) or 256)
    safe = "".join(c if c.isalnum() or c in "_.-" else "_" for c in name)[:64] or "model"
    return Target(safe, files, spec.task, size, inputs=[path])


def _from_repository(path: Path, model: Optional[str]) -> Target:
    from serve.repository import read_repository
    try:
        data = read_repository(path)
    except InvalidInput as exc:
        raise CLIError(str(exc)) from None
    models = [m for m in data.get("models", []) if isinstance(m, dict)]
    if model:
        models = [m for m in models if m.get("name") == model]
    if len(models) != 1:
        names = ", ".join(str(m.get("name")) for m in data.get("models", [])) or "none"
        raise CLIError(f"{path}: {'no model named ' + repr(model) if model else 'pick one'} "
                       f"with --model (its models: {names})" if model or len(models) > 1 else
                       f"{path}: no models to tune")
    chosen = models[0]
    file = Path(str(chosen.get("path", "")))
    if not file.is_file():
        raise CLIError(f"{path}: model file not found: {file}")
    from irpe.weights import cache_dir
    target = _from_file(file, str(chosen["name"]), cache_dir() / "tune")
    target.model_keys = {k: v for k, v in chosen.items() if k not in TUNED_KEYS}
    target.server = {k: v for k, v in data.items() if k not in ("models", "threads")}
    target.inputs = [path, file]
    return target


def backends_for(target: Target, wanted: Optional[List[str]] = None) -> List[str]:
    """The backends that can serve ``target`` here, the default (``backend: auto``) first:
    openvino (an .onnx or IR; when installed), onnxruntime (an .onnx), torch (weights)."""
    from irpe.runtime.pick import onnx_runtime
    have: List[str] = []
    if "onnx" in target.files:
        have += [onnx_runtime("cpu"), "onnxruntime", "openvino"]
    if "ir" in target.files:
        have.append("openvino")
    if "weights" in target.files:
        have.append("torch")
    have = [b for b in dict.fromkeys(have) if b != "openvino" or _openvino()]
    if not wanted and len(have) > 1:  # an exported file runs faster than eager torch on a CPU
        have = [b for b in have if b != "torch"]
    if wanted:
        missing = [b for b in wanted if b not in have]
        if missing:
            raise CLIError(f"--backends {','.join(missing)}: not available for this model here "
                           f"(available: {', '.join(have)})")
        return [b for b in have if b in wanted]
    return have


def _openvino() -> bool:
    import importlib.util
    return importlib.util.find_spec("openvino") is not None
