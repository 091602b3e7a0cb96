"""Which layers of a built engine are plugin layers, read from the engine itself.

With a GPU the engine inspector answers (``IEngineInspector``, layer information as JSON). A
TensorRT-RTX plan built ahead of time cannot be deserialized without a GPU, but it carries its
compiled graph as text, where each plugin layer is one ``custom_layer={ name="..." ...}`` record;
that is what is read there (observed with TensorRT-RTX 1.7; other plan formats answer None).
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from types import ModuleType
from typing import Dict, List, Optional

__all__ = ["engine_plugin_layers"]

_CUSTOM_LAYER = re.compile(rb'custom_layer=\{ name="([^"]+)"')
_PLUGIN_TYPE = re.compile(rb'buffer=\{ name="([^"]+)_pluginType"')


def _from_plan_text(plan: bytes) -> Optional[Dict[str, List[str]]]:
    if b"custom_layer={" not in plan and b"fully_connected={" not in plan \
            and b"buffer={ name=" not in plan:
        return None  # not a plan format with a readable graph
    layers = sorted({m.decode() for m in _CUSTOM_LAYER.findall(plan)})
    typed = sorted({m.decode() for m in _PLUGIN_TYPE.findall(plan)})
    return {"plugin_layers": layers, "plugin_type_records": typed, "source": "plan graph records"}


def _from_inspector(trt: ModuleType, plan: bytes) -> Optional[Dict[str, List[str]]]:
    from irpe.runtime.tensorrt.common import make_logger
    runtime = trt.Runtime(make_logger(trt))
    engine = runtime.deserialize_cuda_engine(plan)
    if engine is None:
        return None
    info = json.loads(engine.create_engine_inspector().get_engine_information(
        trt.LayerInformationFormat.JSON))
    layers = [layer for layer in info.get("Layers", []) if isinstance(layer, dict)]
    plugins = sorted(layer.get("Name", "") for layer in layers
                     if "plugin" in str(layer.get("LayerType", "")).lower())
    return {"plugin_layers": plugins, "plugin_type_records": plugins, "source": "engine inspector"}


def engine_plugin_layers(engine_path: os.PathLike, trt: Optional[ModuleType] = None,
                         ) -> Optional[Dict[str, List[str]]]:
    """Plugin layer names of an engine file, and how they were found; None if unreadable."""
    plan = Path(engine_path).read_bytes()
    if trt is not None:
        try:
            import torch
            if torch.cuda.is_available():
                return _from_inspector(trt, plan)
        except ImportError:
            pass
    return _from_plan_text(plan)
