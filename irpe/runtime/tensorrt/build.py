"""ONNX -> serialized TensorRT engine (+ JSON sidecar), with ``tensorrt`` or TensorRT-RTX.

RPE nodes become plugin layers when a plugin library providing ``irpe::RPEGather`` /
``irpe::RPEScatter`` is loaded; otherwise TensorRT expands their local functions. The sidecar
records which happened, the precision, profiles, versions and the ONNX metadata.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple, Union

from irpe.artifact.contract import read_onnx_props, write_sidecar
from irpe.atomic import atomic_path, write_bytes
from irpe.errors import InvalidInput
from irpe.outputs import check_outputs
from irpe.runtime.tensorrt.common import (
    EngineBuildError,
    import_tensorrt,
    is_rtx,
    load_plugins,
    make_logger,
)
from irpe.runtime.tensorrt.isolate import build_in_subprocess, child_main

if TYPE_CHECKING:
    from _typeshed import StrPath

__all__ = ["build_engine", "parse_compute_capability", "default_ranges", "PRECISIONS"]

PRECISIONS = ("fp32", "tf32", "fp16")
Range3 = Tuple[int, int, int]


def parse_compute_capability(trt: ModuleType, text: str) -> Any:
    """'SM89', 'sm_89', '8.9' or '89' -> trt.ComputeCapability.SM89 (TensorRT-RTX only)."""
    if not hasattr(trt, "ComputeCapability"):
        raise InvalidInput(f"--compute-capability needs TensorRT-RTX; {trt.__name__} builds for "
                           "the GPU it runs on")
    digits = "".join(ch for ch in text if ch.isdigit())
    member = "CURRENT" if text.strip().lower() == "current" else f"SM{digits}"
    if not digits and member != "CURRENT" or not hasattr(trt.ComputeCapability, member):
        known = [m for m in dir(trt.ComputeCapability) if m.startswith("SM")]
        raise InvalidInput(f"unknown compute capability {text!r}; {trt.__name__} knows {known}")
    return getattr(trt.ComputeCapability, member)


def _check_range(name: str, values: Sequence[int]) -> Range3:
    values = tuple(int(v) for v in values)
    if len(values) != 3 or not 1 <= values[0] <= values[1] <= values[2]:
        raise InvalidInput(f"{name} needs min <= opt <= max (all >= 1), got {values}")
    return values


def _profiles(network: Any, batch: Range3, height: Optional[Range3],
              width: Optional[Range3]) -> Dict[str, List[List[int]]]:
    """min/opt/max shape of every network input; dynamic H/W need height/width ranges."""
    shapes = {}
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        dims = list(tensor.shape)
        rows = []
        for k in range(3):
            shape = [batch[k] if j == 0 and d == -1 else d for j, d in enumerate(dims)]
            if len(shape) == 4:
                for axis, rng, label in ((2, height, "height"), (3, width, "width")):
                    if shape[axis] == -1:
                        if rng is None:
                            raise InvalidInput(f"input {tensor.name} has a dynamic {label}: "
                                               f"give a {label} range (min,opt,max)")
                        shape[axis] = rng[k]
            if -1 in shape:
                raise InvalidInput(f"input {tensor.name} {dims}: no range for a dynamic axis")
            rows.append(shape)
        shapes[tensor.name] = rows
    return shapes


def _parse(trt: ModuleType, builder: Any, logger: Any, onnx_path: str,
           override: bool) -> Tuple[Any, Any]:
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if override:
        if not hasattr(trt.OnnxParserFlag, "ENABLE_PLUGIN_OVERRIDE"):
            raise InvalidInput(f"{trt.__name__} {trt.__version__} has no ENABLE_PLUGIN_OVERRIDE")
        parser.set_flag(trt.OnnxParserFlag.ENABLE_PLUGIN_OVERRIDE)
    if not parser.parse_from_file(onnx_path):
        errors = [str(parser.get_error(i).desc()) for i in range(parser.num_errors)]
        raise InvalidInput(f"TensorRT could not parse {onnx_path}: {'; '.join(errors[:5])}")
    return network, parser


def _plugin_layers(trt: ModuleType, network: Any) -> List[str]:
    kinds = {getattr(trt.LayerType, k) for k in ("PLUGIN", "PLUGIN_V2", "PLUGIN_V3")
             if hasattr(trt.LayerType, k)}
    return [network.get_layer(i).name for i in range(network.num_layers)
            if network.get_layer(i).type in kinds]


def _configure(trt: ModuleType, builder: Any, precision: str, workspace_mib: Optional[int],
               compute_capability: Optional[str]) -> Tuple[Any, Any]:
    config = builder.create_builder_config()
    if precision not in PRECISIONS:
        raise InvalidInput(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if hasattr(trt.BuilderFlag, "TF32"):
        (config.set_flag if precision == "tf32" else config.clear_flag)(trt.BuilderFlag.TF32)
    if precision == "fp16":
        if not hasattr(trt.BuilderFlag, "FP16"):
            raise InvalidInput(f"{trt.__name__} builds strongly typed networks (no FP16 builder "
                               "flag): fp16 needs an fp16 ONNX graph; use fp32 or tf32")
        config.set_flag(trt.BuilderFlag.FP16)
    if hasattr(trt, "ProfilingVerbosity"):  # per-layer types for the engine inspector
        config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    if workspace_mib is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_mib) << 20)
    target = None
    if is_rtx(trt):
        target = _rtx_target(trt, compute_capability)
        config.num_compute_capabilities = 1
        config.set_compute_capability(target, 0)
    elif compute_capability is not None:
        parse_compute_capability(trt, compute_capability)  # raises: not available here
    return config, target


def _rtx_target(trt: ModuleType, compute_capability: Optional[str]):
    if compute_capability is not None:
        return parse_compute_capability(trt, compute_capability)
    import torch
    if not torch.cuda.is_available():
        raise InvalidInput("no CUDA GPU here: pass a compute capability to build ahead of time "
                           "(e.g. --compute-capability SM89)")
    return trt.ComputeCapability.CURRENT


def _timing_cache(trt: ModuleType, config: Any, path: Optional[str]) -> Any:
    """Load (or start) a timing cache; TensorRT-RTX has none (its timing-cache calls are no-ops)."""
    if path is None or is_rtx(trt):
        if path is not None:
            print(f"[build-engine] {trt.__name__} has no timing cache; ignoring {path}",
                  file=sys.stderr)
        return None
    data = Path(path).read_bytes() if os.path.isfile(path) else b""
    cache = config.create_timing_cache(data)
    config.set_timing_cache(cache, False)
    return cache


def default_ranges(props: Dict[str, str]) -> Dict[str, Range3]:
    """Batch (and detection height/width) ranges from the file's irpe metadata."""
    if props.get("irpe.task") != "detection":
        return {"batch": (1, 8, 32)}
    pre = json.loads(props.get("irpe.preprocess", "{}"))
    short, long = int(pre.get("min_size", 800)), int(pre.get("max_size", 1333))
    opt = min(long, short * 4 // 3)
    return {"batch": (1, 2, 8), "height": (32, short, long), "width": (32, opt, long)}


def _check_fixed_size(props: Dict[str, str], onnx_path: str, height: Optional[Sequence[int]],
                      width: Optional[Sequence[int]]) -> None:
    """Refuse height/width ranges for a classifier: its input size is fixed in the file."""
    if (height is not None or width is not None) and props.get("irpe.task") != "detection":
        flags = " and ".join(f for f, v in (("--height", height), ("--width", width)) if v)
        raise InvalidInput(f"{flags}: {props.get('irpe.model_name', onnx_path)} takes a fixed "
                           "input size (height/width ranges are for detection models)")


def check_parsable(props: Dict[str, str], onnx_path: os.PathLike | str) -> None:
    """Refuse an int8 file TensorRT's ONNX parser cannot read, naming why (the parser itself
    answers such files with bare "false" descriptions): dynamic quantisation (ConvInteger /
    MatMulInteger / DynamicQuantizeLinear) and static QDQ made for ONNX Runtime (int32 biases,
    non-zero activation zero points). The record is ``irpe quantize``'s (docs/quantize.md)."""
    from irpe.artifact.contract import onnx_quantization
    try:
        record = onnx_quantization(props) or {}
    except ValueError:
        return  # an unreadable record: let the parser judge the graph
    redo = "quantise the fp32 file with `irpe quantize --calibration DIR|shapes --target tensorrt`"
    if record.get("mode") == "dynamic":
        raise InvalidInput(f"{onnx_path} was quantised dynamically for ONNX Runtime "
                           "(ConvInteger / MatMulInteger / DynamicQuantizeLinear), which "
                           f"TensorRT cannot parse; {redo}")
    if record.get("mode") == "static" and record.get("target", "onnxruntime") != "tensorrt":
        raise InvalidInput(f"{onnx_path} was quantised for ONNX Runtime (int32 biases, "
                           f"activation zero points), which TensorRT cannot parse; {redo}")


def build_engine(onnx_path: StrPath, engine_path: StrPath, *, precision: str = "fp32",
                 batch: Optional[Sequence[int]] = None, height: Optional[Sequence[int]] = None,
                 width: Optional[Sequence[int]] = None, workspace_mib: Optional[int] = None,
                 timing_cache: Optional[str] = None, plugins: Sequence[str] = (),
                 plugin_override: bool = False, compute_capability: Optional[str] = None,
                 module: Optional[str] = None, progress: bool = False,
                 isolate: Optional[bool] = None) -> Dict:
    """Build and write an engine; returns the sidecar dict (also written as JSON beside it).

    Unset ranges default from the file's metadata (:func:`default_ranges`). ``isolate`` (default:
    when plugins are given) builds in a child process (:mod:`irpe.runtime.tensorrt.isolate`),
    which reads the file; this process then does not. The metadata is read once per build.
    """
    if isolate or (isolate is None and plugins):
        return build_in_subprocess(dict(
            onnx_path=onnx_path, engine_path=engine_path, precision=precision, batch=batch,
            height=height, width=width, workspace_mib=workspace_mib, timing_cache=timing_cache,
            plugins=list(plugins), plugin_override=plugin_override,
            compute_capability=compute_capability, module=module, progress=progress))
    onnx_path, engine_path = os.fspath(onnx_path), Path(engine_path)
    check_outputs([engine_path], [onnx_path, *plugins])  # the engine and its sidecar
    props = read_onnx_props(onnx_path)
    check_parsable(props, onnx_path)
    _check_fixed_size(props, onnx_path, height, width)
    defaults = default_ranges(props)
    batch = _check_range("batch", batch or defaults["batch"])
    height = height or defaults.get("height")
    width = width or defaults.get("width")
    height = _check_range("height", height) if height is not None else None
    width = _check_range("width", width) if width is not None else None
    trt = import_tensorrt(module)
    logger = make_logger(trt)
    start = time.perf_counter()
    creators = load_plugins(trt, plugins)
    builder = trt.Builder(logger)
    network, _parser = _parse(trt, builder, logger, onnx_path, plugin_override)
    config, target = _configure(trt, builder, precision, workspace_mib, compute_capability)
    shapes = _profiles(network, batch, height, width)
    profile = builder.create_optimization_profile()
    for name, (lo, opt, hi) in shapes.items():
        profile.set_shape(name, lo, opt, hi)
    config.add_optimization_profile(profile)
    cache = _timing_cache(trt, config, timing_cache)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise EngineBuildError(f"TensorRT failed to build {engine_path.name}: "
                           f"{'; '.join(logger.messages[-3:]) or 'see log above'}")
    if cache is not None and timing_cache is not None:
        write_bytes(timing_cache, bytes(cache.serialize()))
    sidecar = _sidecar(trt, props, onnx_path, engine_path, precision, shapes, target, plugins,
                       creators, plugin_override, _plugin_layers(trt, network),
                       time.perf_counter() - start)
    sidecar["timing_cache"] = (os.path.abspath(timing_cache)
                               if cache is not None and timing_cache is not None else None)
    sidecar["build_warnings"] = list(logger.messages)
    with atomic_path(engine_path) as part:  # the engine appears last, its sidecar in place
        part.write_bytes(bytes(plan))
        write_sidecar(engine_path, sidecar)
    if progress:
        print(f"[build-engine] {engine_path} ({engine_path.stat().st_size / 1e6:.1f} MB) in "
              f"{sidecar['build_seconds']:.1f} s; rpe plugin layers: "
              f"{len(sidecar['plugin_layers'])}", file=sys.stderr)
    return sidecar


def _sidecar(trt: ModuleType, props: Dict[str, str], onnx_path: Union[str, os.PathLike],
             engine_path: Path, precision: str, shapes: Dict[str, List[List[int]]], target: Any,
             plugins: Sequence[str], creators: List[str], override: bool,
             plugin_layers: List[str], seconds: float) -> Dict:
    """The sidecar's fields; ``props``: the ONNX file's metadata, read once by build_engine."""
    return {
        "engine": engine_path.name, "onnx": os.path.abspath(onnx_path),
        "tensorrt_module": trt.__name__, "tensorrt_version": trt.__version__,
        "precision": precision, "profiles": shapes,
        "compute_capability": target.name if target is not None else "build GPU",
        "plugin_libraries": [os.path.abspath(p) for p in plugins], "plugin_creators": creators,
        "plugin_override": bool(override), "plugin_layers": plugin_layers,
        "rpe_nodes": _rpe_route(props, plugin_layers),
        "build_seconds": round(seconds, 2), "onnx_metadata": props,
    }


def _rpe_route(props: Dict[str, str], plugin_layers: List[str]) -> str:
    """How the engine computes the RPE ops (recorded in the sidecar)."""
    if plugin_layers:
        return "plugin"
    if props.get("irpe.inline") == "true":
        return "inlined at export (--inline file)"
    if props.get("irpe.rpe_nodes", "{}") == "{}":
        return "none in the model"
    return "local functions inlined by the parser"


if __name__ == "__main__":  # the child of build_in_subprocess
    sys.exit(child_main(lambda **kw: build_engine(**kw, isolate=False), sys.argv[1:]))
