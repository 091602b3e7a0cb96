"""Trained-model files: safetensors weights + the metadata serving and export need.

One format for everything this project writes after training: ``irpe.model_name`` (registry
name), ``irpe.task``, ``irpe.class_names`` (JSON list), ``irpe.preprocess`` (JSON of
:class:`irpe.data.Preprocess` fields), ``irpe.overrides`` (JSON builder overrides). The same keys
go into ONNX ``metadata_props``, so every artifact describes itself.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple, Union

from torch import nn

from irpe.artifact.filecheck import check_file
from irpe.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from irpe.models import ModelInfo, create_model, model_info
from irpe.rpe import RPEConfig

if TYPE_CHECKING:  # irpe.data imports PIL; this module imports it only when a transform is made
    from irpe.data.transforms import Preprocess

__all__ = ["ModelSpec", "default_spec", "save_trained", "read_spec", "load_trained",
           "spec_from_metadata"]

FORMAT = "irpe-1"


@dataclass
class ModelSpec:
    """What a trained model is: registry name, task, labels, eval transform, builder overrides."""

    model_name: str
    task: str
    class_names: List[str]
    preprocess: Dict = field(default_factory=dict)
    overrides: Dict = field(default_factory=dict)

    def build(self, checkpoint: Optional[str] = None,
              info: Optional[ModelInfo] = None) -> nn.Module:
        """The registered model with these overrides (and weights when ``checkpoint`` is set);
        ``info``: its registry entry when the caller has looked it up already."""
        if info is not None and info.name != self.model_name:
            raise ValueError(f"registry entry {info.name} given for a {self.model_name} spec")
        return create_model(info or self.model_name, checkpoint=checkpoint,
                            **self.build_overrides())

    def build_overrides(self) -> Dict:
        """Builder keyword arguments (JSON form decoded, e.g. iRPE config strings)."""
        return _decode(self.overrides)

    def transform(self) -> Preprocess:
        """The :class:`irpe.data.Preprocess` this model was trained and evaluated with."""
        from irpe.data.transforms import Preprocess
        return Preprocess.from_dict(self.preprocess)

    def metadata(self) -> Dict[str, str]:
        """String key/values for safetensors metadata and ONNX metadata_props."""
        return {"irpe.format": FORMAT, "irpe.model_name": self.model_name,
                "irpe.task": self.task, "irpe.class_names": json.dumps(self.class_names),
                "irpe.preprocess": json.dumps(self.preprocess),
                "irpe.overrides": json.dumps(_encode(self.overrides))}


def default_spec(model_name: Union[str, ModelInfo], class_names: Optional[List[str]] = None,
                 **overrides) -> ModelSpec:
    """Spec of a registered model (its name, or its entry when already looked up) with its
    family's eval transform (DeiT / DETR defaults)."""
    info = model_name if isinstance(model_name, ModelInfo) else model_info(model_name)
    num = overrides.get("num_classes", info.config.get("num_classes", 1000))
    names = list(class_names) if class_names is not None else [f"class_{i}" for i in range(num)]
    if len(names) != num:
        raise ValueError(f"{len(names)} class names for a model with {num} classes")
    preprocess = {"task": info.task}
    if info.task == "classification":
        preprocess["size"] = info.config.get("img_size", 224)
    preprocess.update(info.preprocess)
    return ModelSpec(info.name, info.task, names, preprocess, dict(overrides))


def save_trained(model: nn.Module, path: str, spec: ModelSpec,
                 extra: Optional[Dict[str, str]] = None) -> None:
    """Write ``model``'s weights and ``spec`` (+ string ``extra`` such as training figures)."""
    meta = dict(extra or {})
    meta.update(spec.metadata())
    save_checkpoint(model, path, meta)


def spec_from_metadata(meta: Dict[str, str]) -> ModelSpec:
    """Inverse of :meth:`ModelSpec.metadata`; a clear error for files of another kind."""
    if meta.get("irpe.format") != FORMAT:
        raise CheckpointError("not an irpe trained-model file (metadata irpe.format missing); "
                              "plain checkpoints load with create_model(name, checkpoint=...)")
    try:
        return ModelSpec(meta["irpe.model_name"], meta["irpe.task"],
                         json.loads(meta["irpe.class_names"]), json.loads(meta["irpe.preprocess"]),
                         json.loads(meta["irpe.overrides"]))
    except (KeyError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"corrupt irpe metadata: {exc}") from None


def read_spec(path: str) -> Tuple[ModelSpec, Dict[str, str]]:
    """Spec and raw metadata of a trained-model .safetensors file, without loading weights."""
    from safetensors import safe_open
    check_file(path, "safetensors")
    try:
        with safe_open(path, framework="pt") as handle:
            meta = handle.metadata() or {}
    except Exception as exc:  # safetensors raises its own error types on corrupt headers
        raise CheckpointError(f"cannot read {path}: {exc}") from None
    return spec_from_metadata(meta), meta


def load_trained(path: str, info: Optional[ModelInfo] = None) -> Tuple[nn.Module, ModelSpec]:
    """Build the model a trained-model file describes and load its weights (eval mode);
    ``info``: a registry entry the caller has looked up (used when it is the file's model)."""
    spec, _ = read_spec(path)
    model = spec.build(info=info if info is not None and info.name == spec.model_name else None)
    load_checkpoint(model, path, strict=True)
    return model.eval(), spec


def _encode(overrides: Dict) -> Dict:
    return {k: v.to_dict() if isinstance(v, RPEConfig) else
            (list(v) if isinstance(v, tuple) else v) for k, v in overrides.items()}


def _decode(overrides: Dict) -> Dict:
    return {k: RPEConfig.from_dict(v) if isinstance(v, dict) and ("config" in v or "rpe" in v)
            else v for k, v in overrides.items()}
