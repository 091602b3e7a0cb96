"""The export contract in an OpenVINO IR file (``.xml`` + ``.bin``), written by
``irpe quantize --target openvino``.

An IR carries the same metadata as an exported ONNX file's ``metadata_props`` (spec, iRPE
config, precision, quantisation record), stored as ``rt_info`` entries under one ``irpe`` node:
``<rt_info><irpe><irpe.spec value="..."/>...``. Readers take them from the XML with the
standard library, so serve / validate / eval learn the task, labels and preprocessing of an IR
without loading OpenVINO or the weights.
"""
from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from typing import TYPE_CHECKING, Dict, List, Union

from irpe.artifact.filecheck import check_file
from irpe.errors import InvalidInput

if TYPE_CHECKING:
    import openvino

    from irpe.artifact.trained import ModelSpec

__all__ = ["IR_SUFFIX", "RT_INFO_NODE", "LIBRARY_OPSET", "is_ir", "weights_path",
           "read_ir_props", "read_ir_spec", "set_ir_props", "library_ops"]

IR_SUFFIX = ".xml"
RT_INFO_NODE = "irpe"  # rt_info child that holds the metadata entries
# the opset of the iRPE OpenVINO library's operations (plugins/openvino): an IR quantised where
# the library was loaded stores its RPEAttention / RPEGather / RPEScatter layers under it, and
# reads back only with that library
LIBRARY_OPSET = "irpe"
FileName = Union[str, "os.PathLike[str]"]  # a file name as callers hold it


def is_ir(path: FileName) -> bool:
    """True for a file named as an OpenVINO IR (``.xml``)."""
    return os.fspath(path).lower().endswith(IR_SUFFIX)


def weights_path(xml_path: FileName) -> str:
    """The IR's weights file: the same name with ``.bin``."""
    return os.fspath(xml_path)[:-len(IR_SUFFIX)] + ".bin"


def read_ir_props(path: FileName) -> Dict[str, str]:
    """The ``irpe`` rt_info entries of an IR; a clear error for a missing or foreign file."""
    path = os.fspath(path)
    check_file(path, "ir")
    if not os.path.isfile(weights_path(path)):
        raise FileNotFoundError(f"{path}: its weights file {weights_path(path)} is missing")
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:
        raise InvalidInput(f"{path} is not a readable OpenVINO IR file: {exc}") from None
    node = root.find(f"rt_info/{RT_INFO_NODE}")
    if root.tag != "net" or node is None:
        raise InvalidInput(f"{path} is an OpenVINO IR without the irpe metadata (not written by "
                         "`irpe quantize --target openvino`)")
    return {child.tag: child.get("value", "") for child in node}


def read_ir_spec(path: FileName) -> "ModelSpec":
    """The :class:`irpe.artifact.trained.ModelSpec` stored in an IR."""
    from irpe.artifact.trained import spec_from_metadata
    from irpe.checkpoint import CheckpointError
    props = read_ir_props(path)
    try:
        return spec_from_metadata(props)
    except CheckpointError as exc:
        raise InvalidInput(f"{os.fspath(path)}: {exc}") from None


def set_ir_props(model: "openvino.Model", props: Dict[str, str]) -> None:
    """Store ``props`` as the ``irpe`` rt_info of an OpenVINO model (saved with it)."""
    for key, value in props.items():
        model.set_rt_info(value, [RT_INFO_NODE, key])


def library_ops(path: FileName) -> List[str]:
    """The layer types of the iRPE OpenVINO library (opset :data:`LIBRARY_OPSET`) in an IR,
    sorted, once each: empty when the IR reads with OpenVINO alone."""
    path = os.fspath(path)
    check_file(path, "ir")
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:
        raise InvalidInput(f"{path} is not a readable OpenVINO IR file: {exc}") from None
    return sorted({layer.get("type", "") for layer in root.iter("layer")
                   if layer.get("version") == LIBRARY_OPSET})
