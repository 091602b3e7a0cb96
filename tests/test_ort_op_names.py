"""Every op name of domain ``irpe`` is spelled the same in Python and C++, and written once: the
op table irpe.artifact.ops holds the domain, the op names and each native library's op set;
the names the ONNX Runtime library registers (plugins/onnxruntime, read from the sources and
from the built library) are exactly its ORT_LIBRARY_OPS, the OpenVINO library's operations
(plugins/openvino) exactly its OPENVINO_LIBRARY_OPS in opset OPENVINO_OPSET; the exporter, the
graph rewrites and both runtimes take them from it; no Python module spells an op name or the
domain of its own."""
from __future__ import annotations

import re
from pathlib import Path

import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from export import functions
from irpe.artifact import ops
from irpe.artifact.contract import DEFAULT_OPSET
from irpe.artifact.ops import OPENVINO_LIBRARY_OPS, ORT_LIBRARY_OPS
from tests.helpers import ROOT

ORT_SOURCES = ROOT / "plugins" / "onnxruntime"
OV_SOURCES = ROOT / "plugins" / "openvino"
OP_NAME = re.compile(r'"(RPE[A-Za-z0-9]*)"')


def _function_body(text: str, signature: str) -> str:
    """The braces-delimited body of the C++ function whose definition starts with signature."""
    start = text.index("{", text.index(signature))
    depth = 0
    for end in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[end], 0)
        if depth == 0:
            return text[start:end + 1]
    raise AssertionError(f"unbalanced braces after {signature!r}")


def registered_in_sources() -> set:
    """Op names the library can register: what op_name() returns plus the k*Name constants,
    after checking that every GetName() returns one of those."""
    config = (ORT_SOURCES / "rpe_config.cpp").read_text()
    names = set(OP_NAME.findall(_function_body(config, "char const* op_name(")))
    constants = dict(re.findall(r'constexpr const char\* (k\w+Name) = "(RPE\w*)";',
                                (ORT_SOURCES / "rpe_ort.h").read_text()))
    names |= set(constants.values())
    for source in sorted(ORT_SOURCES.glob("*.cpp")):
        text = source.read_text()
        bodies = re.findall(r"const char\* GetName\(\) const\s*(\{[^}\n]*\}|\{.*?\n    \})",
                            text, re.S)
        assert len(bodies) == text.count("GetName() const"), f"{source.name}: unread GetName()"
        for body in bodies:
            returned = set(re.findall(r"\b(k\w+Name)\b", body))
            assert returned <= set(constants) and (returned or "op_name(" in body), \
                f"{source.name}: GetName() returns a name outside op_name()/k*Name: {body}"
    return names


def test_the_sources_register_exactly_the_ort_table():
    registered = registered_in_sources()
    assert registered - ORT_LIBRARY_OPS == set(), "registered in C++, unknown to Python"
    assert ORT_LIBRARY_OPS - registered == set(), "named in Python, not registered in C++"


def test_the_openvino_library_has_exactly_the_openvino_table():
    """Its operations (OPENVINO_OP(name, opset)) are OPENVINO_LIBRARY_OPS in OPENVINO_OPSET, and
    each is mapped from an ONNX node of the same name in DOMAIN."""
    declared = re.findall(r'OPENVINO_OP\("(\w+)", "(\w+)"\)',
                          (OV_SOURCES / "rpe_ov_ops.hpp").read_text())
    assert {name for name, _ in declared} == OPENVINO_LIBRARY_OPS
    assert {opset for _, opset in declared} == {ops.OPENVINO_OPSET}
    mapped = re.findall(r'(?:OpExtension<[\w:]+>>|ConversionExtension>)\("(\w+)", "(\w+)"',
                        (OV_SOURCES / "rpe_ov_extension.cpp").read_text())
    assert {name for name, _ in mapped} == OPENVINO_LIBRARY_OPS
    assert {domain for _, domain in mapped} == {ops.DOMAIN}


def test_exporter_ops_are_the_library_ops():
    assert (functions.DOMAIN, functions.GATHER, functions.SCATTER) == \
        (ops.DOMAIN, ops.GATHER, ops.SCATTER)
    assert (functions.PLUGIN_NAMESPACE, functions.PLUGIN_VERSION) == \
        (ops.PLUGIN_NAMESPACE, ops.PLUGIN_VERSION)
    assert {functions.GATHER, functions.SCATTER} <= OPENVINO_LIBRARY_OPS <= ORT_LIBRARY_OPS


def test_the_domain_is_written_once():
    """No module but irpe/artifact/ops.py assigns the literal "irpe" to a domain, namespace or
    opset name."""
    assigned = re.compile(r'^\s*\w*(DOMAIN|NAMESPACE|OPSET)\w*\s*(:[^=\n]*)?=\s*"irpe"', re.M)
    found = sorted(str(path.relative_to(ROOT)) for folder in ("irpe", "export", "serve")
                   for path in (ROOT / folder).rglob("*.py") if assigned.search(path.read_text()))
    assert found == ["irpe/artifact/ops.py"]


@pytest.mark.parametrize("module", ["graph/rewrites.py", "graph/rewrite_attention.py",
                                    "graph/rewrite_qlayout.py", "onnxruntime/session.py",
                                    "openvino/library.py"])
def test_runtimes_take_every_op_name_from_the_table(module):
    """No op name literal in the runtime's modules: a rename in the table reaches every use."""
    text = (ROOT / "irpe" / "runtime" / module).read_text()
    code = "\n".join(line.split("#")[0] for line in text.splitlines())
    code = re.sub(r'"""(.*?)"""', "", code, flags=re.S)  # docstrings may name the ops
    assert OP_NAME.findall(code) == []


def test_the_openvino_runtime_reads_no_onnxruntime_module():
    """The op table is irpe.artifact.ops: the OpenVINO side imports nothing of the ONNX
    Runtime package for it."""
    for path in sorted((ROOT / "irpe" / "runtime" / "openvino").glob("*.py")):
        assert "irpe.runtime.onnxruntime" not in path.read_text(), path.name


def test_every_python_op_literal_is_a_library_op():
    """Op-name strings anywhere in irpe/, export/, serve/ are library ops (or class names)."""
    classes = {"RPEConfig", "RPEMultiheadAttention", "RPEAttention"}
    strays = {}
    for folder in ("irpe", "export", "serve"):
        for path in (ROOT / folder).rglob("*.py"):
            found = set(OP_NAME.findall(path.read_text())) - ORT_LIBRARY_OPS - classes
            if found:
                strays[str(path.relative_to(ROOT))] = sorted(found)
    assert strays == {}


def _one_node(op: str) -> bytes:
    node = helper.make_node(op, ["x", "index"], ["out"], domain=ops.DOMAIN, num_buckets=4)
    graph = helper.make_graph([node], "op", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 4]),
        helper.make_tensor_value_info("index", TensorProto.INT64, [2, 2])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", DEFAULT_OPSET),
                                                    helper.make_opsetid(ops.DOMAIN, 1)])
    model.ir_version = 9
    return model.SerializeToString()


def _unknown_to(library: Path, op: str) -> bool:
    """Whether ONNX Runtime with ``library`` registered says ``op`` is no op it knows."""
    options = ort.SessionOptions()
    options.register_custom_ops_library(str(library))
    try:
        ort.InferenceSession(_one_node(op), options, providers=["CPUExecutionProvider"])
    except Exception as err:  # noqa: BLE001 - the message tells unknown ops from bad nodes
        return "is not a registered function/op" in str(err)
    return False


def test_the_built_library_registers_every_name(ort_library):
    """The real library: each table name is a known op, a name outside the table is not."""
    assert _unknown_to(ort_library, "RPENoSuchOp")
    unknown = sorted(op for op in ORT_LIBRARY_OPS if _unknown_to(ort_library, op))
    assert unknown == []
