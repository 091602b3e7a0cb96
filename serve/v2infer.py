"""v2 inference on a served model: tensor validation, batching, requested outputs."""
from __future__ import annotations

import weakref
from typing import Dict, List, Optional, Tuple

import numpy as np

from irpe.artifact.contract import input_names, output_names
from irpe.artifact.triton_config import V2_TYPES, TensorInfo, model_config, onnx_io

from .errors import ServeError
from .model import ServedModel
from .v2codec import InferRequest, OutTensor, classification_strings, datatype_of

__all__ = ["model_metadata", "run_infer", "triton_config"]


def _tensor(name: str, datatype: str, shape: List[int]) -> Dict:
    return {"name": name, "datatype": datatype, "shape": shape}


def model_metadata(model: ServedModel) -> Dict:
    """v2 model metadata; output shapes are known once warmup ran (-1 before)."""
    p = model.preprocess
    inputs = [_tensor("images", "FP32", [-1, 3, p.size, p.size] if model.task ==
                      "classification" else [-1, 3, -1, -1])]
    if model.task == "detection":
        inputs.append(_tensor("sizes", "INT64", [-1, 2]))
    shapes = model.output_shapes
    outputs = [_tensor(n, "FP32", [-1] + list(shapes.get(n, (-1,) * (2 if n == "logits" else 3))
                                              [1:])) for n in output_names(model.task)]
    return {"name": model.name, "versions": ["1"], "platform": model.backend.platform,
            "inputs": inputs, "outputs": outputs,
            "parameters": {"task": model.task, "labels": model.labels,
                           "preprocess": p.to_dict(), "model": model.spec.model_name,
                           "backend": model.cfg.backend, "precision": model.precision}}


_CONFIGS: "weakref.WeakKeyDictionary[ServedModel, Dict]" = weakref.WeakKeyDictionary()


def triton_config(model: ServedModel) -> Dict:
    """Triton's model configuration of ``model`` as served: its batching, instances and device
    kind; tensors read from the ONNX file for onnxruntime (as `irpe triton-repo` reads them),
    else from the v2 metadata. Built once per model (reading an ONNX file is not free)."""
    if model in _CONFIGS:
        return _CONFIGS[model]
    cfg = model.cfg
    if cfg.backend == "onnxruntime":
        inputs, outputs = onnx_io(cfg.path)
    else:
        meta = model_metadata(model)
        inputs, outputs = ([TensorInfo(t["name"], V2_TYPES[t["datatype"]], t["shape"], True)
                            for t in meta[key]] for key in ("inputs", "outputs"))
    config = model_config(model.name, model.backend.platform, inputs, outputs,
                          cfg.max_batch_size, round(cfg.max_queue_delay_ms * 1000),
                          cfg.instances, "gpu" if cfg.device.startswith("cuda") else "cpu",
                          "labels.txt" if model.task == "classification" else None)
    if model.ready:  # output shapes are known after warmup: keep only the final answer
        _CONFIGS[model] = config
    return config


def _images(model: ServedModel, tensors: Dict[str, np.ndarray], names: Tuple[str, ...],
            nonfinite: str) -> np.ndarray:
    if set(tensors) - set(names) or "images" not in tensors:
        raise ServeError(400, f"model {model.name} takes inputs {list(names)}"
                         f", got {sorted(tensors)}")
    images = tensors["images"]
    if images.dtype != np.float32 or images.ndim != 4 or images.shape[1] != 3:
        raise ServeError(400, f"images must be FP32 [batch, 3, height, width], got "
                         f"{datatype_of(images)} {list(images.shape)}")
    p = model.preprocess
    if model.task == "classification" and images.shape[2:] != (p.size, p.size):
        raise ServeError(400, f"images must be [batch, 3, {p.size}, {p.size}] for model "
                         f"{model.name}, got {list(images.shape)}")
    if model.task == "detection" and not p.fits(*images.shape[2:]):
        raise ServeError(400, f"image height and width must be in 1..{p.max_size}, got "
                         f"{list(images.shape[2:])}")
    if nonfinite == "reject" and not np.isfinite(images).all():
        raise ServeError(400, "images contain NaN or infinity")
    return images


def _sizes(images: np.ndarray, sizes: Optional[np.ndarray]) -> List[Tuple[int, int]]:
    batch, height, width = images.shape[0], images.shape[2], images.shape[3]
    if sizes is None:
        return [(height, width)] * batch
    if sizes.dtype not in (np.int64, np.int32) or sizes.shape != (batch, 2):
        raise ServeError(400, f"sizes must be INT64 [{batch}, 2], got {datatype_of(sizes)} "
                         f"{list(sizes.shape)}")
    if (sizes < 1).any() or (sizes[:, 0] > height).any() or (sizes[:, 1] > width).any():
        raise ServeError(400, f"sizes must be valid (h, w) within 1..{height} x 1..{width}")
    return [(int(h), int(w)) for h, w in sizes]


async def run_infer(model: ServedModel, req: InferRequest, tensors: Dict[str, np.ndarray],
                    nonfinite: str = "accept") -> List[OutTensor]:
    """Validate inputs, run them through the model's one pass (image count, queue room,
    batching), build the requested outputs. ``nonfinite`` (ServeSettings.v2_nonfinite):
    "accept" computes NaN / infinity as given (Triton's behaviour; each image is computed on
    its own, so they reach only that image's outputs), "reject" answers 400."""
    in_names, out_names = input_names(model.task), output_names(model.task)  # export contract
    images = _images(model, tensors, in_names, nonfinite)
    sizes = _sizes(images, tensors.get("sizes")) if model.task == "detection" else None
    wanted, timeout_s = _requested(model, req, out_names), _timeout(model, req)
    rows = await model.infer(list(images), sizes, timeout_s)
    outputs = []
    for name, params in wanted:
        array = np.stack([r[name] for r in rows])
        binary = params.get("binary_data", req.parameters.get("binary_data_output", False))
        k = params.get("classification")
        if k is None:
            outputs.append(OutTensor(name, array, datatype_of(array), bool(binary)))
        else:
            outputs.append(OutTensor(name, classification_strings(array, k, model.labels),
                                     "BYTES", bool(binary)))
    return outputs


def _requested(model: ServedModel, req: InferRequest, names: Tuple[str, ...]
               ) -> List[Tuple[str, Dict]]:
    if req.outputs is None:
        return [(n, {}) for n in names]
    for out in req.outputs:
        if out.name not in names:
            raise ServeError(400, f"unknown output {out.name!r}; model {model.name} has "
                             f"{list(names)}")
        k = out.parameters.get("classification")
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1
                              or out.name != "logits"):
            raise ServeError(400, f"classification must be a positive integer on the logits "
                             f"output, got {k!r} on {out.name}")
    return [(o.name, o.parameters) for o in req.outputs]


def _timeout(model: ServedModel, req: InferRequest) -> float:
    """tritonclient's per-request ``timeout`` (microseconds) caps the model's timeout_s; 0 or
    absent: the model's (Triton's "no request timeout"); anything else is a 400."""
    micros = req.parameters.get("timeout")
    if micros is None or micros == 0 and not isinstance(micros, bool):
        return model.cfg.timeout_s
    if isinstance(micros, bool) or not isinstance(micros, (int, float)) or not \
            0 < micros < float("inf"):
        raise ServeError(400, f"parameters.timeout must be a positive number of microseconds "
                         f"(0: the model's timeout), got {micros!r}")
    return min(model.cfg.timeout_s, micros / 1e6)
