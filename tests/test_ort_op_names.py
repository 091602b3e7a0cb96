"""Every op name of domain ``irpe`` is spelled the same in Python and C++: the names the custom-op
library registers (plugins/onnxruntime, read from the sources and from the built library) are
exactly irpe.runtime.onnxruntime.op_names.LIBRARY_OPS, which the exporter and the graph rewrites
use; no Python module spells an op name of its own."""
from __future__ import annotations

import re
from pathlib import Path

import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from export import functions
from irpe.artifact.contract import DEFAULT_OPSET
from irpe.runtime.onnxruntime import op_names
from irpe.runtime.onnxruntime.op_names import LIBRARY_OPS
from tests.helpers import ROOT

ORT_SOURCES = ROOT / "plugins" / "onnxruntime"
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


def test_the_sources_register_exactly_the_python_table():
    registered = registered_in_sources()
    assert registered - LIBRARY_OPS == set(), "registered in C++, unknown to Python"
    assert LIBRARY_OPS - registered == set(), "named in Python, not registered in C++"


def test_exporter_ops_are_the_library_ops():
    assert (functions.DOMAIN, functions.GATHER, functions.SCATTER) == \
        (op_names.DOMAIN, op_names.GATHER, op_names.SCATTER)
    assert {functions.GATHER, functions.SCATTER} <= LIBRARY_OPS


@pytest.mark.parametrize("module", ["rewrites.py", "rewrite_attention.py", "rewrite_qlayout.py",
                                    "session.py"])
def test_rewrites_take_every_op_name_from_the_table(module):
    """No op name literal in the runtime's modules: a rename in op_names reaches every use."""
    text = (ROOT / "irpe" / "runtime" / "onnxruntime" / module).read_text()
    code = "\n".join(line.split("#")[0] for line in text.splitlines())
    code = re.sub(r'"""(.*?)"""', "", code, flags=re.S)  # docstrings may name the ops
    assert OP_NAME.findall(code) == []


def test_every_python_op_literal_is_a_library_op():
    """Op-name strings anywhere in irpe/, export/, serve/ are library ops (or class names)."""
    classes = {"RPEConfig", "RPEMultiheadAttention", "RPEAttention"}
    strays = {}
    for folder in ("irpe", "export", "serve"):
        for path in (ROOT / folder).rglob("*.py"):
            found = set(OP_NAME.findall(path.read_text())) - LIBRARY_OPS - classes
            if found:
                strays[str(path.relative_to(ROOT))] = sorted(found)
    assert strays == {}


def _one_node(op: str) -> bytes:
    node = helper.make_node(op, ["x", "index"], ["out"], domain=op_names.DOMAIN, num_buckets=4)
    graph = helper.make_graph([node], "op", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 2, 4]),
        helper.make_tensor_value_info("index", TensorProto.INT64, [2, 2])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", DEFAULT_OPSET),
                                                    helper.make_opsetid(op_names.DOMAIN, 1)])
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
    unknown = sorted(op for op in LIBRARY_OPS if _unknown_to(ort_library, op))
    assert unknown == []
