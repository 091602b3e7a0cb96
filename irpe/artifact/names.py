"""How an artifact's files are named: an OpenVINO IR (``m.xml`` with its weights ``m.bin``), a
TensorRT engine (``m.engine`` / ``.plan`` / ``.trt`` with its JSON sidecar ``m.engine.json``).

Names only, no reading: the bottom of :mod:`irpe.artifact`, so the write rule
(:mod:`irpe.outputs`) knows an artifact's companions without importing the readers, which
write through :mod:`irpe.atomic` themselves.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import List, Union

__all__ = ["IR_SUFFIX", "ENGINE_SUFFIXES", "is_ir", "weights_path", "is_engine", "sidecar_path",
           "companions"]

IR_SUFFIX = ".xml"
ENGINE_SUFFIXES = (".engine", ".plan", ".trt")  # file names read as TensorRT engines
FileName = Union[str, "os.PathLike[str]"]  # a file name as callers hold it


def is_ir(path: FileName) -> bool:
    """True for a file named as an OpenVINO IR (``.xml``)."""
    return os.fspath(path).lower().endswith(IR_SUFFIX)


def weights_path(xml_path: FileName) -> str:
    """The IR's weights file: the same name with ``.bin``."""
    return os.fspath(xml_path)[:-len(IR_SUFFIX)] + ".bin"


def is_engine(path: FileName) -> bool:
    """True for a file named as a TensorRT engine."""
    return os.fspath(path).lower().endswith(ENGINE_SUFFIXES)


def sidecar_path(engine_path: FileName) -> Path:
    """The JSON file next to an engine (``model.engine`` -> ``model.engine.json``)."""
    return Path(f"{os.fspath(engine_path)}.json")


def companions(path: FileName) -> List[Path]:
    """``path`` and the files that belong to the same artifact, which are written and read
    with it: an OpenVINO IR's weights (``m.xml`` -> ``m.bin``), a TensorRT engine's sidecar
    (``m.engine`` -> ``m.engine.json``)."""
    files = [Path(path)]
    if is_ir(path):
        files.append(Path(weights_path(path)))
    elif is_engine(path):
        files.append(sidecar_path(path))
    return files
