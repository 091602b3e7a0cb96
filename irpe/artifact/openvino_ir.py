"""The export contract in an OpenVINO IR file (``.xml`` + ``.bin``), written by
``irpe quantize --target openvino``.

An IR carries the same metadata as an exported ONNX file's ``metadata_props`` (spec, iRPE
config, precision, quantisation record), stored as ``rt_info`` entries under one ``irpe`` node:
``<rt_info><irpe><irpe.spec value="..."/>...``. Readers take them from the XML with the
standard library, so serve / validate / eval learn the task, labels and preprocessing of an IR
without loading OpenVINO.

The two files of an IR are written by two renames (OpenVINO names the weights after the
``.xml``, so one rename cannot switch both): :func:`write_ir` moves the ``.bin`` first and the
``.xml`` last, and the ``.xml`` records the size and SHA-256 of its ``.bin``
(:data:`WEIGHTS_SIZE`, :data:`WEIGHTS_SHA256`). :func:`read_ir_props`, which every reader
calls before OpenVINO opens the files, checks them: an ``.xml`` beside the ``.bin`` of another
run (a write cut between its renames, a copy of one file) is one clear error, never a model
that loads with weights that are not its own. IRs written before the record load unchecked.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Tuple, Union

from irpe.artifact.filecheck import check_file
from irpe.artifact.names import IR_SUFFIX, is_ir, weights_path
from irpe.artifact.ops import OPENVINO_OPSET
from irpe.errors import InvalidInput, MissingFile

if TYPE_CHECKING:
    import openvino

    from irpe.artifact.trained import ModelSpec

__all__ = ["IR_SUFFIX", "RT_INFO_NODE", "LIBRARY_OPSET", "WEIGHTS_SIZE", "WEIGHTS_SHA256",
           "is_ir", "weights_path", "read_ir_props", "check_weights", "read_ir_spec",
           "set_ir_props", "write_ir", "library_ops"]

RT_INFO_NODE = "irpe"  # rt_info child that holds the metadata entries
# the opset of the iRPE OpenVINO library's operations (plugins/openvino): an IR quantised where
# the library was loaded stores its RPEAttention / RPEGather / RPEScatter layers under it, and
# reads back only with that library
LIBRARY_OPSET = OPENVINO_OPSET
FileName = Union[str, "os.PathLike[str]"]  # a file name as callers hold it
# the rt_info entries in which write_ir records the IR's .bin (bytes, hex SHA-256)
WEIGHTS_SIZE = "irpe.ir.weights_bytes"
WEIGHTS_SHA256 = "irpe.ir.weights_sha256"
_DIGESTS: Dict[Tuple[str, int, int, int], str] = {}  # (path, inode, size, mtime): digest


def read_ir_props(path: FileName) -> Dict[str, str]:
    """The ``irpe`` rt_info entries of an IR, after checking that its ``.bin`` is there and is
    the one the ``.xml`` was written with; a clear error for a missing or foreign file."""
    path = os.fspath(path)
    check_file(path, "ir")
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:
        raise InvalidInput(f"{path} is not a readable OpenVINO IR file: {exc}") from None
    node = root.find(f"rt_info/{RT_INFO_NODE}")
    if root.tag != "net" or node is None:
        raise InvalidInput(f"{path} is an OpenVINO IR without the irpe metadata (not written by "
                         "`irpe quantize --target openvino`)")
    props = {child.tag: child.get("value", "") for child in node}
    check_weights(path, props)
    return props


def check_weights(path: FileName, props: Dict[str, str]) -> None:
    """Raise :class:`MissingFile` when the IR's ``.bin`` is missing, :class:`InvalidInput`
    when its size or SHA-256 is not the one ``props`` (the ``.xml``'s record) gives; an IR
    without the record (written before it) passes with its ``.bin`` present."""
    xml, weights = os.fspath(path), weights_path(path)
    if not os.path.isfile(weights):
        raise MissingFile(f"the IR's weights {weights} are missing: {xml} cannot load "
                          "without them")
    if WEIGHTS_SIZE not in props:
        return
    size, recorded = os.path.getsize(weights), props[WEIGHTS_SIZE]
    if str(size) != recorded:
        why = f"{xml} was written with a {recorded}-byte .bin, this one has {size} bytes"
    elif _sha256(weights) != props.get(WEIGHTS_SHA256):
        why = f"its SHA-256 is not the one {xml} records"
    else:
        return
    raise InvalidInput(f"the IR's weights {weights} do not belong to {xml} (written by another "
                       f"run?): {why}")


def _sha256(path: str) -> str:
    """The hex SHA-256 of a file, remembered for the same file unchanged (readers ask for the
    props of one IR several times)."""
    stat = os.stat(path)
    key = (os.path.realpath(path), stat.st_ino, stat.st_size, stat.st_mtime_ns)
    if key not in _DIGESTS:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        _DIGESTS[key] = digest.hexdigest()
    return _DIGESTS[key]


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


def write_ir(model: "openvino.Model", path: FileName) -> None:
    """Save ``model`` as an IR at ``path`` (``.xml``, weights beside it as ``.bin``), complete
    or not at all: saved in a folder beside ``path``, the ``.bin``'s size and SHA-256 recorded
    in the ``.xml``'s rt_info, then the ``.bin`` moved into place and the ``.xml`` last, SIGINT
    held across both moves (:func:`irpe.atomic.atomic_files`)."""
    import openvino as ov

    from irpe.atomic import atomic_files
    xml = Path(path)
    with atomic_files([weights_path(xml), xml]) as (weights_part, xml_part), \
            tempfile.TemporaryDirectory(dir=xml_part.parent, prefix=".ir-stage-") as stage:
        staged = os.path.join(stage, "model.xml")
        ov.save_model(model, staged, compress_to_fp16=False)
        _record_weights(staged)
        os.replace(weights_path(staged), weights_part)
        os.replace(staged, xml_part)


def _record_weights(xml: str) -> None:
    """Add the size and SHA-256 of the IR's ``.bin`` to the ``irpe`` rt_info of its ``.xml``
    (made if absent), rewriting the ``.xml`` in place."""
    weights = weights_path(xml)
    tree = ET.parse(xml)
    root = tree.getroot()
    info = root.find("rt_info")
    if info is None:
        info = ET.SubElement(root, "rt_info")
    node = info.find(RT_INFO_NODE)
    if node is None:
        node = ET.SubElement(info, RT_INFO_NODE)
    for key, value in ((WEIGHTS_SIZE, str(os.path.getsize(weights))),
                       (WEIGHTS_SHA256, _sha256(weights))):
        for old in node.findall(key):
            node.remove(old)
        ET.SubElement(node, key, value=value)
    tree.write(xml, encoding="utf-8", xml_declaration=True)


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
