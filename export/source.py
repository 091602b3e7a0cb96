"""Resolve what to export or validate: registry name (+ checkpoint), trained-model file, module.

The same resolution is used by export and validation, so a file exported from random weights
(seed :data:`RANDOM_SEED`) can be validated later by rebuilding the same model.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Optional, Union

import torch
from torch import nn

from irpe.artifact.trained import ModelSpec, default_spec, load_trained, read_spec
from irpe.checkpoint import CheckpointError
from irpe.errors import InvalidInput, MissingFile
from irpe.models import ModelInfo, model_info
from irpe.models.registry import bundled_weights

__all__ = ["Source", "load_source", "RANDOM_SEED", "weights_from_metadata"]

RANDOM_SEED = 0
SourceLike = Union[str, os.PathLike, nn.Module]


@dataclass
class Source:
    """A model in eval mode, the spec that describes it, and where its weights came from."""

    model: nn.Module
    spec: ModelSpec
    weights: str  # "checkpoint:PATH" | "trained:PATH" | "bundled:FILE" | "random:seed=N" | "module"


def _is_file_source(source: str) -> bool:
    return source.endswith(".safetensors") or os.path.sep in source or os.path.isfile(source)


def load_source(source: SourceLike, checkpoint: Optional[str] = None,
                spec: Optional[ModelSpec] = None) -> Source:
    """Model + spec for a registry name (+ checkpoint), a trained-model .safetensors file or an
    nn.Module (with ``spec``, else the defaults of its ``model_name``)."""
    if isinstance(source, nn.Module):
        return _from_module(source, spec)
    source = os.fspath(source)
    if not _is_file_source(source):
        return _from_registry(source, checkpoint, spec)
    if checkpoint is not None:
        raise InvalidInput(f"{source} is a trained-model file and carries its weights; "
                           "do not pass a checkpoint as well")
    model, file_spec = load_trained(source)
    return Source(model, spec or file_spec, f"trained:{os.path.abspath(source)}")


def _from_registry(name: str, checkpoint: Optional[str], spec: Optional[ModelSpec]) -> Source:
    """A registered model: weights from ``checkpoint``, else bundled, else random (seeded)."""
    info = model_info(name)  # UnknownName naming close matches; the one registry look-up
    if checkpoint is not None:
        if not os.path.isfile(checkpoint):
            raise MissingFile(f"checkpoint not found: {checkpoint}")
        spec = spec or _checkpoint_spec(info, checkpoint)
        model = spec.build(checkpoint, info=_entry(info, spec))
        return Source(model.eval(), spec, f"checkpoint:{os.path.abspath(checkpoint)}")
    if info.weights is not None:  # a trained-model file: its labels and preprocessing too
        model, file_spec = load_trained(bundled_weights(info), info=info)
        return Source(model, spec or file_spec, f"bundled:{info.weights}")
    spec = spec or default_spec(info)
    warnings.warn(f"{info.name}: no checkpoint given and no bundled weights; using RANDOM "
                  f"weights (seed {RANDOM_SEED})", stacklevel=3)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(RANDOM_SEED)
        model = spec.build(info=_entry(info, spec))
    return Source(model.eval(), spec, f"random:seed={RANDOM_SEED}")


def _entry(info: ModelInfo, spec: ModelSpec) -> Optional[ModelInfo]:
    """``info`` when it is the entry of ``spec``'s model (a caller's spec may name another)."""
    return info if spec.model_name == info.name else None


def _checkpoint_spec(info: ModelInfo, checkpoint: str) -> ModelSpec:
    """The spec a trained-model checkpoint carries (labels, preprocessing), else the defaults."""
    try:
        spec = read_spec(checkpoint)[0]
    except (CheckpointError, ValueError):  # a plain checkpoint (.pth, safetensors w/o metadata)
        return default_spec(info)
    if spec.model_name != info.name:
        raise InvalidInput(f"{checkpoint} is a trained {spec.model_name} model, not "
                           f"{info.name}; name the file alone to export it")
    return spec


def _from_module(model: nn.Module, spec: Optional[ModelSpec]) -> Source:
    if spec is None:
        name = getattr(model, "model_name", None)
        if name is None:
            raise ValueError("exporting an nn.Module needs spec= (irpe.artifact.trained.ModelSpec)")
        spec = default_spec(name)
    return Source(model.eval(), spec, "module")


def weights_from_metadata(weights: str, spec: ModelSpec) -> Source:
    """Rebuild the PyTorch model an exported file was made from (its irpe.weights entry)."""
    kind, _, value = weights.partition(":")
    if kind == "trained":
        return load_source(value)
    if kind == "checkpoint":
        return load_source(spec.model_name, checkpoint=value, spec=spec)
    if kind == "bundled":
        info = model_info(spec.model_name)
        model = spec.build(bundled_weights(info), info=info)
        return Source(model.eval(), spec, weights)
    if kind == "random":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(value.partition("=")[2] or RANDOM_SEED))
            model = spec.build()
        return Source(model.eval(), spec, weights)
    raise InvalidInput(f"cannot rebuild the PyTorch model from weights {weights!r}; "
                       "pass the source model (and checkpoint) explicitly")
