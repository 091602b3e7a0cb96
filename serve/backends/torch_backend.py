"""PyTorch backend: a trained-model .safetensors file on CPU or CUDA, in fp32, fp16 or bf16.

Weights and inputs are cast to the model's precision and outputs come back as fp32. A reduced
precision is checked against an fp32 copy of the model on the warmup batch before the model is
ready (tolerances: PRECISION_TOLERANCE). uint8 batches are normalised on the device; on CUDA
they travel through pinned host memory with a non-blocking copy. On CUDA each backend (model
instance) runs on its own stream, so instances overlap copies and kernels; a batch already on
the device (nvJPEG) is read only after the caller's stream has written it. ``cuda_graphs: true``
replays CUDA graphs captured at load time (serve.backends.cuda_graphs).
"""
from __future__ import annotations

import contextlib
import copy
import logging
from typing import TYPE_CHECKING, Callable, ContextManager, Dict, Optional, Union

import numpy as np
import torch
from torch import nn

from irpe.artifact.trained import load_trained, read_spec
from irpe.data.transforms import normalize
from irpe.precision import torch_dtype

from . import Artifact, Backend, output_names

if TYPE_CHECKING:  # imported on use: CUDA graphs are captured only when configured
    from .cuda_graphs import GraphedClassifier

__all__ = ["PRECISION_TOLERANCE", "TorchBackend", "precision_error"]

log = logging.getLogger("irpe.serve")
# largest |output - fp32 output| / max(1, max |fp32 output|) accepted at warmup, per precision
PRECISION_TOLERANCE = {"fp16": 2e-2, "bf16": 5e-2}


def precision_error(out: Dict[str, torch.Tensor], ref: Dict[str, torch.Tensor]) -> float:
    """Largest |out - ref| over all outputs, relative to max(1, largest |ref|)."""
    worst = 0.0
    for key, value in ref.items():
        diff = (out[key].float() - value.float()).abs().max().item()
        worst = max(worst, diff / max(1.0, value.float().abs().max().item()))
    return worst


class TorchBackend(Backend):
    """``irpe.artifact.trained.load_trained`` + eval-mode forward under ``torch.inference_mode``."""

    platform = "pytorch_libtorch"
    graphs: Optional[GraphedClassifier] = None
    model: Optional[nn.Module]  # set by load(), released by close()
    reference: Optional[nn.Module]  # the fp32 copy until the warmup compared against it

    def read_artifact(self) -> Artifact:
        return Artifact(read_spec(str(self.cfg.path))[0])  # cast to the configured precision

    def load(self) -> None:
        device = torch.device(self.cfg.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"model {self.cfg.name}: device {self.cfg.device} requested but "
                               "this torch build has no CUDA device")
        if self.threads:
            torch.set_num_threads(self.threads)
        model, _ = load_trained(str(self.cfg.path))
        self.precision = self.cfg.run_precision()
        self.dtype = torch_dtype(self.precision)
        self.reference = copy.deepcopy(model).to(device) if self.precision != "fp32" else None
        self.model, self.device = model.to(device=device, dtype=self.dtype), device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.mean, self.std = (t.to(device) for t in self.mean_std)
        if self.cfg.cuda_graphs:
            self._capture(self.spec.transform().size)

    def _capture(self, size: int) -> None:
        """CUDA graphs at every bucket (classification; the config refuses other cases)."""
        from .cuda_graphs import CAPTURE_LOCK, GraphedClassifier
        if self.spec.task != "classification":
            raise RuntimeError(f"model {self.cfg.name}: cuda_graphs supports classification "
                               "models only")
        with torch.inference_mode():
            try:
                self.graphs = GraphedClassifier(self._loaded(), (3, size, size), self.dtype,
                                                self.device, self.cfg.max_batch_size)
                log.info("cuda graphs captured", extra={"model": self.cfg.name,
                                                        "batch_sizes": sorted(self.graphs.graphs)})
            except RuntimeError as exc:  # a model whose forward cannot be captured
                log.warning("cuda graphs not captured; running eager", extra={
                    "model": self.cfg.name, "error": str(exc).splitlines()[0][:300]})
                self.graphs = None
                with CAPTURE_LOCK:  # not while another instance captures
                    torch.cuda.synchronize(self.device)

    def _loaded(self) -> nn.Module:
        """The model load() made; a RuntimeError once close() released it."""
        if self.model is None:
            raise RuntimeError(f"model {self.cfg.name}: the backend is closed")
        return self.model

    def _on_stream(self) -> ContextManager[object]:
        """This instance's CUDA stream (no-op on CPU)."""
        return torch.cuda.stream(self.stream) if self.stream is not None \
            else contextlib.nullcontext()

    @torch.inference_mode()
    def infer(self, images: np.ndarray, sizes: Optional[np.ndarray]) -> Dict[str, np.ndarray]:
        with self._on_stream():
            x = torch.from_numpy(images).to(self.device, dtype=self.dtype)
            return self._outputs(self._forward(self._loaded(), x, sizes, self.graphs))

    @torch.inference_mode()
    def infer_uint8(self, images: Union[np.ndarray, torch.Tensor], sizes: Optional[np.ndarray]
                    ) -> Dict[str, np.ndarray]:
        """uint8 batch (numpy, or a tensor already on the device from nvjpeg) -> device
        (pinned + non-blocking on CUDA) -> normalised there."""
        x = images if isinstance(images, torch.Tensor) else torch.from_numpy(images)
        if x.device.type == "cuda":
            self._consume(x)
        with self._on_stream():
            if self.device.type == "cuda" and x.device.type == "cpu":
                x = x.pin_memory().to(self.device, non_blocking=True)
            x = normalize(x, self.mean, self.std, sizes).to(self.dtype)
            return self._outputs(self._forward(self._loaded(), x, sizes, self.graphs))

    def _consume(self, x: torch.Tensor) -> None:
        """Order this instance's stream after the caller's current stream, which wrote ``x``
        (serve.model stacks nvJPEG images there, behind other requests' decodes), and tell the
        allocator ``x`` is in use on this stream until that work is done."""
        if self.stream is None:
            return
        self.stream.wait_stream(torch.cuda.current_stream(x.device))
        x.record_stream(self.stream)

    def warmup(self, images: np.ndarray, sizes: Optional[np.ndarray]) -> Dict[str, np.ndarray]:
        """First batch; in fp16/bf16 also compared with the fp32 model (RuntimeError past the
        tolerance), and the fp32 copy is released."""
        out = self.infer(images, sizes)
        if self.reference is None:
            return out
        with torch.inference_mode(), self._on_stream():
            ref = self._forward(self.reference, torch.from_numpy(images).to(self.device), sizes)
            ref = {k: ref[k].cpu() for k in out}
        self.reference = None
        got = {k: torch.from_numpy(v) for k, v in out.items()}
        error, limit = precision_error(got, ref), \
            PRECISION_TOLERANCE[self.precision]
        log.info("precision check", extra={"model": self.cfg.name, "precision": self.precision,
                                           "rel_error": round(error, 6), "tolerance": limit})
        if not error <= limit:
            raise RuntimeError(f"{self.precision} outputs differ from fp32 by {error:.3g} "
                               f"(relative; tolerance {limit:g}): use precision fp32")
        return out

    def _forward(self, model: torch.nn.Module, x: torch.Tensor, sizes: Optional[np.ndarray],
                 graphs: Optional[Callable[[torch.Tensor], torch.Tensor]] = None
                 ) -> Dict[str, torch.Tensor]:
        if self.spec.task == "classification":
            return {"logits": graphs(x) if graphs is not None else model(x)}
        return model(x, torch.from_numpy(sizes).to(self.device))

    def _outputs(self, out: Dict[str, torch.Tensor]) -> Dict[str, np.ndarray]:
        return {k: out[k].float().cpu().numpy() for k in output_names(self.spec.task)}

    def close(self) -> None:
        self.model = self.reference = self.graphs = None
