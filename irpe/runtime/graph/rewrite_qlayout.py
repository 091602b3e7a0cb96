"""Load-time layout of the iRPE-Q term for the ORT custom ops (stage ``qlayout`` of
:mod:`irpe.runtime.graph.rewrites`). The exporter writes the Q term as
``RPEGather(Reshape(MatMul(k, W), [B, H, 1, L * K]), idt)``, idt[i, j] = j * K + c(i, j): key j's
row of a per-key table [L, K]. Here that table is made bucket-major, ``MatMul(W^T, k^T)`` ->
[B, H, K, L] with idt'[i, j] = c(i, j) * L + j, so the 16 keys of one gather read a few table
rows at consecutive keys instead of 16 rows K floats apart, and the MatMul's output is L wide
instead of K. The same values up to the MatMul's order of summation (not bit-identical: its own
stage, off with ``IRPE_ORT_FUSE=gather,scatter``)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Dict, List, Optional

from irpe.artifact.ops import DOMAIN, GATHER

if TYPE_CHECKING:  # onnx and numpy are imported when a model is rewritten
    import numpy as np
    from onnx import GraphProto, NodeProto

__all__ = ["relayout_q"]
Rank = Callable[[str], int]  # a float tensor's declared rank by name, -1 unknown

_SUFFIX = "/irpe_qlayout"


def _match(node: NodeProto, producer: Dict, uses: Dict, inits: Dict, rank: Rank,
           majors: Dict) -> Optional[tuple]:
    """(MatMul, Mul or None, k, scaled W, bucket-major ids) when ``node`` is the Q-form
    RPEGather; else None. ``majors``: index name -> its bucket-major ids (or None), filled here
    so an index the blocks share is decoded once."""
    import numpy as np
    from onnx import helper, numpy_helper
    if node.op_type != GATHER or node.domain != DOMAIN or len(node.input) != 2:
        return None
    reshape = producer.get(node.input[0])
    if (reshape is None or reshape.op_type != "Reshape" or uses.get(node.input[0]) != 1 or
            reshape.input[1] not in inits):
        return None
    shape = numpy_helper.to_array(inits[reshape.input[1]]).tolist()  # [B, H, 1, L * K] or so
    matmul = producer.get(reshape.input[0])
    if (matmul is None or matmul.op_type != "MatMul" or uses.get(reshape.input[0]) != 1 or
            matmul.input[1] not in inits or node.input[1] not in inits or
            rank(matmul.input[0]) != 4):
        return None
    w = numpy_helper.to_array(inits[matmul.input[1]])
    buckets = {a.name: helper.get_attribute_value(a) for a in node.attribute}.get("num_buckets")
    if w.dtype != np.float32 or w.ndim != 4 or w.shape[0] != 1:
        return None
    kb = w.shape[3]
    key = (node.input[1], kb)
    if key not in majors:
        majors[key] = _bucket_major(numpy_helper.to_array(inits[node.input[1]]), kb)
    major = majors[key]
    if (major is None or buckets != major.shape[1] * kb or len(shape) != 4 or shape[2] != 1 or
            shape[3] not in (-1, major.shape[1] * kb)):
        return None
    source, scale, mul = _scaled_source(matmul.input[0], producer, uses, inits, rank)
    return matmul, mul, source, (w * scale).astype(np.float32), major


def _bucket_major(ids: np.ndarray, kb: int) -> Optional[np.ndarray]:
    """ids c * L + j for Q-form ids j * kb + c, 0 <= c < kb ([Lq, L]), same dtype; None when
    any id is of another form."""
    import numpy as np
    if ids.ndim != 2:
        return None
    keys = np.arange(ids.shape[1], dtype=np.int64)[None, :]
    codes = ids.astype(np.int64) - keys * kb
    if not bool(((codes >= 0) & (codes < kb)).all()):
        return None
    return (codes * ids.shape[1] + keys).astype(ids.dtype)


def _scaled_source(name: str, producer: Dict, uses: Dict, inits: Dict, rank: Rank) -> tuple:
    """(x, s, the Mul) when ``name`` is Mul(x, s), s a float32 scalar initializer, used only
    there (s then goes into W^T, leaving the new Transpose free to merge upstream); else
    (name, 1, None)."""
    import numpy as np
    from onnx import numpy_helper
    mul = producer.get(name)
    if mul is None or mul.op_type != "Mul" or uses.get(name) != 1 or len(mul.input) != 2:
        return name, np.float32(1), None
    for side in (0, 1):
        const, other = mul.input[side], mul.input[1 - side]
        value = numpy_helper.to_array(inits[const]) if const in inits else None
        if value is not None and value.size == 1 and value.dtype == np.float32 and \
                rank(other) == 4:
            return other, np.float32(value.reshape(())), mul
    return name, np.float32(1), None


def relayout_q(graph: GraphProto, rank: Rank, uses: Dict[str, int]) -> int:
    """Rewrites every Q-form RPEGather of ``graph`` in place (``rank(name)``: a float tensor's
    declared rank, -1 unknown; ``uses``: readers per tensor name); returns how many."""
    from onnx import helper, numpy_helper
    producer = {out: node for node in graph.node for out in node.output}
    inits = {t.name: t for t in graph.initializer}
    swap: Dict[int, List] = {}  # id(old node) -> its replacement nodes (the Mul: none)
    replaced = set()  # initializers given a rewritten twin: dropped below when unused
    majors: Dict = {}
    for node in list(graph.node):
        found = _match(node, producer, uses, inits, rank, majors)
        if found is None:
            continue
        matmul, mul, source, w, major = found
        name = matmul.name or matmul.output[0]
        kt, table = matmul.output[0] + _SUFFIX + "/kT", matmul.output[0] + _SUFFIX
        weight = matmul.input[1] + ("" if mul is None else "/scaled")
        replaced.add(matmul.input[1])
        if mul is not None:
            swap[id(mul)] = []
        for name_, value in ((weight, w.transpose(0, 1, 3, 2).copy()),
                             (node.input[1], major)):  # once each: blocks may share an index
            if name_ + _SUFFIX not in inits:
                inits[name_ + _SUFFIX] = numpy_helper.from_array(value, name_ + _SUFFIX)
                graph.initializer.append(inits[name_ + _SUFFIX])
                replaced.add(name_)
        swap[id(matmul)] = [
            helper.make_node("Transpose", [source], [kt], perm=[0, 1, 3, 2],
                             name=name + _SUFFIX + "/Transpose"),
            helper.make_node("MatMul", [weight + _SUFFIX, kt], [table],
                             name=name + _SUFFIX)]
        producer[node.input[0]].input[0] = table
        node.input[1] = node.input[1] + _SUFFIX
    if swap:
        gone = {out for n in graph.node if id(n) in swap for out in n.output}
        nodes = [m for n in graph.node for m in swap.get(id(n), [n])]
        del graph.node[:]
        graph.node.extend(nodes)
        infos = [v for v in graph.value_info if v.name not in gone]
        del graph.value_info[:]
        graph.value_info.extend(infos)
        used = {name for n in graph.node for name in n.input} | {o.name for o in graph.output}
        keep = [t for t in graph.initializer if t.name not in replaced or t.name in used]
        del graph.initializer[:]
        graph.initializer.extend(keep)
    return sum(1 for nodes in swap.values() if nodes)
