"""PyTorch backend: a trained-model .safetensors file on CPU or CUDA."""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np
import torch

from irpe.artifact import ModelSpec, load_trained, read_spec

from . import Backend, output_names

__all__ = ["TorchBackend"]


class TorchBackend(Backend):
    """``irpe.artifact.load_trained`` + eval-mode forward under ``torch.inference_mode``."""

    platform = "pytorch_libtorch"

    def read_spec(self) -> ModelSpec:
        return read_spec(str(self.cfg.path))[0]

    def load(self) -> None:
        device = torch.device(self.cfg.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(f"model {self.cfg.name}: device {self.cfg.device} requested but "
                               "this torch build has no CUDA device")
        if self.threads:
            torch.set_num_threads(self.threads)
        model, _ = load_trained(str(self.cfg.path))
        self.model, self.device = model.to(device), device

    @torch.inference_mode()
    def infer(self, images: np.ndarray, sizes: Optional[np.ndarray]) -> Dict[str, np.ndarray]:
        x = torch.from_numpy(images).to(self.device)
        if self.spec.task == "classification":
            out = {"logits": self.model(x)}
        else:
            out = self.model(x, torch.from_numpy(sizes).to(self.device))
        return {k: out[k].float().cpu().numpy() for k in output_names(self.spec.task)}

    def close(self) -> None:
        self.model = None
