"""Load-time fusion stage ``attention``: a whole self-attention block of an exported model ->
one ``RPEAttention`` node of the custom-op library (plugins/onnxruntime/rpe_attention.cpp),
which keeps the logits, probabilities and iRPE tables of a block of queries in cache.

Applied last by :func:`irpe.runtime.graph.rewrites.fuse_model`, after ``qlayout`` and
``softmax``. It matches the graph those stages leave for the timm/DeiT attention:

    q, k, v = Squeeze(Split(qkv)) (three equal parts);  a = q or Mul(q, scalar)
    P = RPEGatherAdd[2]Softmax[Scatter](MatMul(a, wk), idk, MatMul(a, Transpose(k)),
                                        Reshape(MatMul(wq, Transpose(k))), idq, [idv])
    out = MatMul(P, v)  [-> RPEBucketMatMulAdd(sums, wv, .)]

(the K and Q terms each optional; plain DeiT: ``Softmax(MatMul(a, Transpose(k)))``) and writes
``RPEAttention(a, k, v, wk, idk, wq, idq, idv, wv)`` (absent terms: empty inputs). Anything else
is left as it was. Not bit-identical to the unfused graph (own GEMM order and exp).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from irpe.artifact.contract import DEFAULT_OPSET
from irpe.artifact.ops import (
    ATTENTION,
    BUCKET_MATMUL_ADD,
    DOMAIN,
    GATHER_ADD2,
    SOFTMAX_OPS,
)

if TYPE_CHECKING:
    from onnx import GraphProto, NodeProto

__all__ = ["fuse_attention"]

# The softmax forms of irpe.runtime.graph.rewrites: name -> (gather terms, with the V sums)
_SOFTMAX_FORMS = {name: (2 if add == GATHER_ADD2 else 1, with_v)
                  for (add, with_v), name in SOFTMAX_OPS.items()}


class _Graph:
    """Producers, readers and initializers of a graph's nodes (by index), for matching."""

    def __init__(self, graph: GraphProto) -> None:
        self.nodes = list(graph.node)
        self.producer = {out: k for k, node in enumerate(self.nodes) for out in node.output}
        self.readers: Dict[str, List[int]] = {}
        for k, node in enumerate(self.nodes):
            for name in node.input:
                self.readers.setdefault(name, []).append(k)
        self.outputs = {v.name for v in graph.output}
        self.inits = {t.name: t for t in graph.initializer}

    def only_reader(self, name: str, k: int) -> bool:
        """``name`` is read by node ``k`` alone (once) and is no graph output."""
        return self.readers.get(name, []) == [k] and name not in self.outputs

    def made_by(self, name: str, op_type: str) -> int:
        """The index of the standard-domain ``op_type`` node making ``name``, else -1."""
        k = self.producer.get(name, -1)
        ok = k >= 0 and self.nodes[k].op_type == op_type and self.nodes[k].domain in ("", "ai.onnx")
        return k if ok else -1

    def shared_weight(self, name: str) -> bool:
        """A float32 initializer [1, .., 1, rows, cols]."""
        t = self.inits.get(name)
        return (t is not None and t.data_type == 1 and len(t.dims) >= 2
                and all(d == 1 for d in t.dims[:-2]))


def _attr(node: NodeProto, name: str, default: Any = None) -> Any:
    from onnx import helper
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _transposed(g: _Graph, name: str) -> Optional[str]:
    """k when ``name`` = Transpose(k, perm=[0, 1, 3, 2])."""
    k = g.made_by(name, "Transpose")
    return g.nodes[k].input[0] if k >= 0 and list(_attr(g.nodes[k], "perm", [])) == [0, 1, 3, 2] \
        else None


def _scaled(g: _Graph, a: str) -> Tuple[str, float]:
    """(q, s) when ``a`` = Mul(q, s) with s a scalar initializer (either order), else (a, 1)."""
    from onnx import numpy_helper
    k = g.made_by(a, "Mul")
    if k >= 0:
        node = g.nodes[k]
        for x, s in ((0, 1), (1, 0)):
            t = g.inits.get(node.input[s])
            if t is not None and all(d == 1 for d in t.dims):
                return node.input[x], float(numpy_helper.to_array(t).reshape(-1)[0])
    return a, 1.0


def _equal_parts(g: _Graph, q: str, k: str, v: str) -> bool:
    """q, k, v are Squeeze(outputs 0, 1, 2 of one Split into three equal parts), squeezed alike:
    so they have one shape (self-attention, one head dim)."""
    found = [g.made_by(x, "Squeeze") for x in (q, k, v)]
    if min(found) < 0:
        return False
    nodes = [g.nodes[n] for n in found]
    if len({tuple(n.input[1:]) for n in nodes}) != 1:
        return False
    at = g.made_by(nodes[0].input[0], "Split")
    split = g.nodes[at] if at >= 0 else None
    if split is None or list(split.output) != [n.input[0] for n in nodes]:
        return False
    if len(split.input) > 1 and split.input[1]:
        from onnx import numpy_helper
        t = g.inits.get(split.input[1])
        return t is not None and len(set(numpy_helper.to_array(t).tolist())) == 1
    return True


def _packed(g: _Graph, q: str) -> Optional[str]:
    """X when q = Squeeze(Split(Transpose(X, perm=[2, 0, 3, 1, 4]), axis 0)[0], axes [0]): the
    qkv projection reshaped to [B, L, 3, H, d], which RPEAttention reads with strides."""
    from onnx import numpy_helper
    sq = g.made_by(q, "Squeeze")
    split = g.made_by(g.nodes[sq].input[0], "Split") if sq >= 0 else -1
    tr = g.made_by(g.nodes[split].input[0], "Transpose") if split >= 0 else -1
    if tr < 0 or list(_attr(g.nodes[tr], "perm", [])) != [2, 0, 3, 1, 4] \
            or _attr(g.nodes[split], "axis", 0) != 0:
        return None
    axes = g.inits.get(g.nodes[sq].input[1]) if len(g.nodes[sq].input) > 1 else None
    axes = numpy_helper.to_array(axes).tolist() if axes is not None else _attr(g.nodes[sq], "axes")
    return g.nodes[tr].input[0] if list(axes or []) == [0] else None


def _terms(g: _Graph, at: int, gathers: int, a: str, k: str
           ) -> Optional[Tuple[Dict[str, str], List[int]]]:
    """The gather terms of node ``at`` as RPEAttention inputs (wk/idk, wq/idq) and the nodes
    that made their tables, or None."""
    node = g.nodes[at]
    found: Dict[str, str] = {}
    made: List[int] = []
    for term in range(gathers):
        t, i = node.input[3 * term], node.input[3 * term + 1]
        mm = g.made_by(t, "MatMul")
        if mm >= 0 and g.nodes[mm].input[0] == a and g.shared_weight(g.nodes[mm].input[1]) \
                and g.only_reader(t, at) and "wk" not in found:
            found.update(wk=g.nodes[mm].input[1], idk=i)
            made.append(mm)
            continue
        shape = g.made_by(t, "Reshape")
        mm = g.made_by(g.nodes[shape].input[0], "MatMul") if shape >= 0 else -1
        if (mm >= 0 and g.shared_weight(g.nodes[mm].input[0])
                and _transposed(g, g.nodes[mm].input[1]) == k and g.only_reader(t, at)
                and g.only_reader(g.nodes[shape].input[0], shape) and "wq" not in found):
            found.update(wq=g.nodes[mm].input[0], idq=i)
            made += [shape, mm]
            continue
        return None
    return found, made


def _softmax_form(node: NodeProto, opset: int) -> Optional[Tuple[int, bool]]:
    """(gather terms, with V sums) of an RPE softmax node; (0, False) for a plain Softmax over
    the last axis; None otherwise."""
    if node.domain == DOMAIN:
        return _SOFTMAX_FORMS.get(node.op_type)
    plain = node.op_type == "Softmax" and node.domain in ("", "ai.onnx")
    return (0, False) if plain and _attr(node, "axis", -1 if opset >= 13 else 1) in (-1, 3) \
        else None


def _block(g: _Graph, at: int, opset: int) -> Optional[Tuple[Dict[str, str], str, List[int],
                                                              Dict]]:
    """(inputs, output, nodes replaced, attributes) of the attention block around softmax node
    ``at``."""
    node = g.nodes[at]
    form = _softmax_form(node, opset)
    if form is None:
        return None
    gathers, scatter = form
    logits = node.input[2] if gathers else node.input[0]
    mm = g.made_by(logits, "MatMul")
    k = _transposed(g, g.nodes[mm].input[1]) if mm >= 0 else None
    if k is None or not g.only_reader(logits, at) or not g.only_reader(g.nodes[mm].input[1], mm):
        return None
    a, probs = g.nodes[mm].input[0], node.output[0]
    q, scale = _scaled(g, a)
    pv = g.readers.get(probs, [])
    if (len(pv) != 1 or g.nodes[pv[0]].op_type != "MatMul" or g.nodes[pv[0]].input[0] != probs
            or probs in g.outputs or not _equal_parts(g, q, k, g.nodes[pv[0]].input[1])):
        return None
    terms = _terms(g, at, gathers, a, k)
    if terms is None:
        return None
    inputs = dict(q=a, k=k, v=g.nodes[pv[0]].input[1], **terms[0])
    attrs = {}
    packed = _packed(g, q)
    if packed is not None:  # read q, k, v from the projection; the scale becomes an attribute
        inputs.update(q=packed, k="", v="")
        attrs["scale"] = scale
    replaced = [at, mm, g.producer[g.nodes[mm].input[1]], pv[0]] + terms[1]
    out = g.nodes[pv[0]].output[0]
    if scatter:
        sums = g.readers.get(node.output[1], [])
        bucket = g.nodes[sums[0]] if len(sums) == 1 else None
        if (bucket is None or bucket.op_type != BUCKET_MATMUL_ADD or bucket.input[0] !=
                node.output[1] or bucket.input[2] != out or not g.only_reader(out, sums[0])
                or not g.shared_weight(bucket.input[1])):
            return None
        inputs.update(idv=node.input[-1], wv=bucket.input[1])
        replaced.append(sums[0])
        out = bucket.output[0]
    readers = g.readers.get(out, [])
    if (len(readers) == 1 and g.nodes[readers[0]].op_type == "Transpose" and out not in g.outputs
            and list(_attr(g.nodes[readers[0]], "perm", [])) == [0, 2, 1, 3]):
        attrs["out_layout"] = 1  # write [B, L, H, d]: the Transpose before the projection
        replaced.append(readers[0])
        out = g.nodes[readers[0]].output[0]
    return inputs, out, replaced, attrs


_FEEDERS = ("Transpose", "Reshape", "MatMul", "Mul", "Squeeze", "Split")  # side-effect free


def _unread(nodes: list, outputs: set) -> list:
    """``nodes`` less the _FEEDERS none of whose outputs is read (what fed a replaced block
    only: the q, k, v split, the k transposes, the Q-table product), repeatedly."""
    while True:
        read = {name for node in nodes for name in node.input} | outputs
        keep = [n for n in nodes if n.op_type not in _FEEDERS or any(o in read for o in n.output)]
        if len(keep) == len(nodes):
            return nodes
        nodes = keep


def fuse_attention(graph: GraphProto, opset: int = DEFAULT_OPSET) -> int:
    """Every matching attention block -> one RPEAttention node, in place; returns the count."""
    from onnx import helper
    g = _Graph(graph)
    order = ("q", "k", "v", "wk", "idk", "wq", "idq", "idv", "wv")
    fused_at: Dict[int, NodeProto] = {}
    gone: set = set()
    for at in range(len(g.nodes)):
        found = _block(g, at, opset)
        if found is None or gone & set(found[2]):
            continue
        inputs, out, replaced, attrs = found
        gone |= set(replaced)
        fused_at[max(replaced)] = helper.make_node(
            ATTENTION, [inputs.get(n, "") for n in order], [out],
            name=f"{g.nodes[at].name}/irpe_attention", domain=DOMAIN, **attrs)
    if not fused_at:
        return 0
    nodes = [fused_at.get(k, n) for k, n in enumerate(g.nodes) if k not in gone or k in fused_at]
    nodes = _unread(nodes, g.outputs)
    made = {o for n in nodes for o in n.output} | {i.name for i in graph.input} | set(g.inits)
    infos = [v for v in graph.value_info if v.name in made]
    read = {name for n in nodes for name in n.input}
    fed = {name for k in gone for name in g.nodes[k].input} | \
        {name for n in g.nodes if n.op_type in _FEEDERS for name in n.input}
    inits = [t for t in graph.initializer if t.name in read or t.name not in fed]
    for field, kept in (("node", nodes), ("value_info", infos), ("initializer", inits)):
        del getattr(graph, field)[:]
        getattr(graph, field).extend(kept)
    return len(fused_at)
