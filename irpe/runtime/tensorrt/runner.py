"""TensorRT runtime wrapper on torch CUDA tensors (used by validation and serving).

Inputs and outputs are torch tensors on the engine's device; the engine runs on the current
torch CUDA stream via ``execute_async_v3`` with tensor addresses, so no pycuda / cuda-python
buffers or copies are needed and callers order work with ordinary torch stream semantics.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

import torch

from irpe.artifact.filecheck import check_file
from irpe.errors import GPURequired, InvalidInput
from irpe.runtime.tensorrt.common import import_tensorrt, load_plugins, make_logger

if TYPE_CHECKING:
    from _typeshed import StrPath

__all__ = ["TRTRunner", "require_gpu"]


def require_gpu() -> None:
    """GPURequired (one line) where torch sees no CUDA GPU: every engine needs one."""
    if not torch.cuda.is_available():
        raise GPURequired("TensorRT engines need a CUDA GPU (torch.cuda.is_available() is "
                          "False here); on CPU use the .onnx file (OpenVINO or ONNX Runtime)")


def _torch_dtype(trt: Any, dtype: Any) -> torch.dtype:
    table = {"FLOAT": torch.float32, "HALF": torch.float16, "BF16": torch.bfloat16,
             "INT32": torch.int32, "INT64": torch.int64, "INT8": torch.int8,
             "UINT8": torch.uint8, "BOOL": torch.bool}
    if dtype.name not in table:
        raise TypeError(f"engine tensor type {dtype.name} has no torch equivalent here")
    return table[dtype.name]


class TRTRunner:
    """Deserialize an engine once; ``runner(images=..., sizes=...)`` -> dict of output tensors.

    Thread-safe (one execution context behind a lock). Outputs are new tensors on the device,
    produced on the current stream of that device.
    """

    def __init__(self, engine_path: StrPath, plugins: Sequence[str] = (),
                 device: Optional[torch.device] = None, module: Optional[str] = None) -> None:
        check_file(engine_path, "engine")  # missing, empty, truncated or not an engine
        require_gpu()
        self.trt = trt = import_tensorrt(module)
        self.device = torch.device(device or "cuda")
        load_plugins(trt, plugins)
        self._logger = make_logger(trt)
        with torch.cuda.device(self.device):
            self._runtime = trt.Runtime(self._logger)
            self.engine = self._runtime.deserialize_cuda_engine(Path(engine_path).read_bytes())
            if self.engine is None:
                raise RuntimeError(f"cannot deserialize {engine_path}: "
                                   f"{'; '.join(self._logger.messages[-3:])}")
            self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        is_input = {n: self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT for n in names}
        self.input_names: List[str] = [n for n in names if is_input[n]]
        self.output_names: List[str] = [n for n in names if not is_input[n]]
        self.dtypes = {n: _torch_dtype(trt, self.engine.get_tensor_dtype(n)) for n in names}
        self._lock = threading.Lock()

    def profile_shapes(self, name: str) -> List[tuple]:
        """(min, opt, max) shapes of input ``name`` in optimization profile 0."""
        return [tuple(s) for s in self.engine.get_tensor_profile_shape(name, 0)]

    def __call__(self, **inputs: torch.Tensor) -> Dict[str, torch.Tensor]:
        missing = set(self.input_names) - set(inputs)
        if missing:
            raise ValueError(f"missing engine inputs: {sorted(missing)}")
        with self._lock, torch.cuda.device(self.device):
            stream = torch.cuda.current_stream(self.device)
            keep = self._bind_inputs(inputs)
            outputs = self._bind_outputs()
            if not self.context.execute_async_v3(stream.cuda_stream):
                raise RuntimeError("TensorRT execution failed: "
                                   f"{'; '.join(self._logger.messages[-3:])}")
            del keep  # same-stream reuse by the caching allocator is ordered after the engine
        return outputs

    def _bind_inputs(self, inputs: Dict[str, torch.Tensor]) -> List[torch.Tensor]:
        keep = []
        for name in self.input_names:
            tensor = inputs[name].to(self.device, self.dtypes[name]).contiguous()
            if not self.context.set_input_shape(name, tuple(tensor.shape)):
                raise InvalidInput(f"input {name} shape {tuple(tensor.shape)} is outside the "
                                   f"engine's profile {self.profile_shapes(name)}")
            self.context.set_tensor_address(name, tensor.data_ptr())
            keep.append(tensor)
        return keep

    def _bind_outputs(self) -> Dict[str, torch.Tensor]:
        outputs = {}
        for name in self.output_names:
            shape = tuple(self.context.get_tensor_shape(name))
            out = torch.empty(shape, dtype=self.dtypes[name], device=self.device)
            self.context.set_tensor_address(name, out.data_ptr())
            outputs[name] = out
        return outputs
