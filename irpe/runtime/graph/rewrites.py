"""Load-time fusion for the ONNX Runtime custom-op library: ``Add(x, RPEGather(t, i))`` ->
``RPEGatherAdd(t, i, x)``, one pass over the attention logits instead of two; two such in a row
(the iRPE-K and iRPE-Q terms) -> one ``RPEGatherAdd2``; and the iRPE-V term
``Add(x, MatMul(RPEScatter(a, i), W))`` -> ``RPEScatterMatMulAdd(a, i, W, x)`` (the scatter's and
the MatMul's outputs never reach memory); then ``Softmax(RPEGatherAdd*(...))`` ->
``RPEGatherAdd*Softmax`` (logits built and normalised in one pass) and, where the probabilities
also feed an ``RPEScatterMatMulAdd``, ``RPEGatherAdd*SoftmaxScatter`` whose 2nd output (the V
bucket sums, taken from each row while it is in cache) feeds ``RPEBucketMatMulAdd(sums, W, x)``.
First of all (stage ``qlayout``, irpe.runtime.graph.rewrite_qlayout) the iRPE-Q table is
made bucket-major.

Applied by :func:`irpe.runtime.onnxruntime.session.create_session` to the model it hands to ONNX
Runtime, only when the CPU library is registered; the file on disk is never changed. A pair is
fused when the gather's output is float32, feeds that one Add and nothing else; anything
unexpected (a file onnx cannot parse, external data, no type information) leaves the model as
it is.
"""
from __future__ import annotations

import logging
from typing import (
    TYPE_CHECKING,
    Collection,
    Dict,
    FrozenSet,
    List,
    NamedTuple,
    Optional,
    Set,
    Tuple,
    Union,
)

from irpe.artifact.contract import DEFAULT_OPSET
from irpe.artifact.ops import (
    BUCKET_MATMUL_ADD,
    DOMAIN,
    GATHER,
    GATHER_ADD,
    GATHER_ADD2,
    SCATTER,
    SCATTER_MATMUL_ADD,
    SOFTMAX_OPS,
)
from irpe.runtime.graph.rewrite_attention import fuse_attention
from irpe.runtime.graph.rewrite_qlayout import relayout_q

if TYPE_CHECKING:
    from onnx import GraphProto, ModelProto, NodeProto

__all__ = ["STAGES", "FuseCounts", "fuse_gather_add", "fuse_model", "fuse_proto",
           "fuse_graph", "fuse_chains", "fuse_scatter", "fuse_softmax", "parse_stages"]

log = logging.getLogger("irpe.runtime.onnxruntime.session")

STAGES = ("qlayout", "gather", "scatter", "softmax", "attention")  # in the order applied


class FuseCounts(NamedTuple):
    """How many of each fusion a model got."""

    gather: int = 0  # Add(x, RPEGather) pairs
    scatter: int = 0  # Add(x, MatMul(RPEScatter, W)) chains
    softmax: int = 0  # Softmax(RPEGatherAdd*) (of which with the V bucket sums: scatter_sums)
    scatter_sums: int = 0
    qlayout: int = 0  # Q-form gathers made bucket-major (irpe.runtime.graph.rewrite_qlayout)
    attention: int = 0  # whole attention blocks run as RPEAttention (rewrite_attention)


def parse_stages(setting: str) -> FrozenSet[str]:
    """The rewrite-stage setting (``OrtOptions.fuse``, ``$IRPE_ORT_FUSE``): "1"/""/"all" all,
    "0"/"none" none, else a comma list of :data:`STAGES`."""
    text = setting.strip().lower()
    if text in ("", "1", "all"):
        return frozenset(STAGES)
    if text in ("0", "none"):
        return frozenset()
    stages = frozenset(part.strip() for part in text.split(",") if part.strip())
    unknown = sorted(stages - set(STAGES))
    if unknown:
        raise ValueError(f"unknown rewrite stage {', '.join(unknown)} "
                         f"(0, 1 or a comma list of {', '.join(STAGES)})")
    return stages


def _float_outputs(graph: GraphProto) -> Set[str]:
    """Names of float32 tensors the graph declares (value_info and outputs)."""
    from onnx import TensorProto
    return {v.name for v in list(graph.value_info) + list(graph.output)
            if v.type.tensor_type.elem_type == TensorProto.FLOAT}


def _consumers(graph: GraphProto) -> Dict[str, int]:
    uses: Dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    for out in graph.output:
        uses[out.name] = uses.get(out.name, 0) + 1
    return uses


def _pairs(graph: GraphProto) -> List[Tuple[int, int, int]]:
    """(gather index, add index, which Add input is the gather) of every fusable pair."""
    producer = {out: k for k, node in enumerate(graph.node) for out in node.output}
    uses, floats = _consumers(graph), _float_outputs(graph)
    found = []
    for k, node in enumerate(graph.node):
        if node.op_type != "Add" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
            continue
        for side, name in enumerate(node.input):
            g = producer.get(name)
            if g is None or node.input[1 - side] == name:
                continue
            gather = graph.node[g]
            if (gather.domain == DOMAIN and gather.op_type == GATHER and
                    len(gather.input) == 2 and uses.get(name) == 1 and name in floats):
                found.append((g, k, side))
                break
    return found


def fuse_graph(graph: GraphProto) -> int:
    """Fuse every pair in ``graph`` (the main graph, in place); returns how many."""
    from onnx import helper
    pairs = _pairs(graph)
    drop: Set[int] = set()
    replace: Dict[int, NodeProto] = {}
    for g, k, side in pairs:
        gather, add = graph.node[g], graph.node[k]
        fused = helper.make_node(GATHER_ADD,
                                 [gather.input[0], gather.input[1], add.input[1 - side]],
                                 list(add.output), name=(add.name or gather.name) + "/irpe_fused",
                                 domain=DOMAIN)
        fused.attribute.extend(gather.attribute)
        drop.add(g)
        replace[k] = fused  # at the Add's place: every input is produced before it
    _rewrite(graph, drop, replace)
    return len(pairs)


def fuse_chains(graph: GraphProto) -> int:
    """``RPEGatherAdd(t2, i2, RPEGatherAdd(t1, i1, x))`` -> ``RPEGatherAdd2(t1, i1, x, t2, i2)``
    (the iRPE-K then iRPE-Q terms: the logits pass once), in place; returns how many."""
    from onnx import helper
    producer = {out: k for k, node in enumerate(graph.node) for out in node.output}
    uses = _consumers(graph)
    drop: Set[int] = set()
    replace: Dict[int, NodeProto] = {}
    for k, node in enumerate(graph.node):
        if node.domain != DOMAIN or node.op_type != GATHER_ADD or k in drop:
            continue
        first = producer.get(node.input[2])
        if first is None or first in drop or first in replace or uses.get(node.input[2]) != 1:
            continue
        inner = graph.node[first]
        if inner.domain != DOMAIN or inner.op_type != GATHER_ADD:
            continue
        merged = helper.make_node(GATHER_ADD2, list(inner.input) + list(node.input[:2]),
                                  list(node.output), name=node.name + "2", domain=DOMAIN)
        merged.attribute.extend(inner.attribute)  # num_buckets: checked for the first table
        drop.add(first)
        replace[k] = merged
    _rewrite(graph, drop, replace)
    return len(replace)


def _shared_weight(graph: GraphProto, name: str, buckets: int) -> bool:
    """``name`` is a float32 initializer [1, .., 1, K, D] with K == ``buckets``."""
    from onnx import TensorProto
    for init in graph.initializer:
        if init.name == name:
            dims = list(init.dims)
            return (init.data_type == TensorProto.FLOAT and len(dims) >= 2 and
                    dims[-2] == buckets and all(d == 1 for d in dims[:-2]))
    return False


def _float_rank(graph: GraphProto, name: str) -> int:
    """Rank of the float32 tensor ``name`` as the graph declares it; -1 when unknown."""
    from onnx import TensorProto
    for v in list(graph.value_info) + list(graph.output) + list(graph.input):
        tensor = v.type.tensor_type
        if v.name == name and tensor.HasField("shape") and tensor.elem_type == TensorProto.FLOAT:
            return len(tensor.shape.dim)
    return -1


def _scatter_chain(graph: GraphProto, add: NodeProto, producer: Dict[str, int],
                   uses: Dict[str, int], floats: Set[str]) -> Optional[Tuple[int, int, str]]:
    """(scatter index, MatMul index, base name) when ``add`` is Add(base, MatMul(scatter, W))."""
    from onnx import helper
    if add.op_type != "Add" or add.domain not in ("", "ai.onnx") or len(add.input) != 2:
        return None
    for side, name in enumerate(add.input):
        m = producer.get(name)
        if m is None or uses.get(name) != 1 or name not in floats:
            continue
        mm = graph.node[m]
        s = producer.get(mm.input[0]) if mm.op_type == "MatMul" and mm.domain in ("", "ai.onnx") \
            else None
        if s is None or uses.get(mm.input[0]) != 1 or mm.input[0] not in floats:
            continue
        sc = graph.node[s]
        attrs = {a.name: helper.get_attribute_value(a) for a in sc.attribute}
        base = add.input[1 - side]
        if (sc.domain == DOMAIN and sc.op_type == SCATTER and len(sc.input) == 2 and
                _shared_weight(graph, mm.input[1], attrs.get("num_buckets", 0)) and
                1 <= _float_rank(graph, base) <= 4 and base != name):
            return s, m, base
    return None


def fuse_scatter(graph: GraphProto) -> int:
    """``Add(x, MatMul(RPEScatter(a, i), W))`` -> ``RPEScatterMatMulAdd(a, i, W, x)`` in place
    (W a float32 initializer shared by the heads, x of rank <= 4); returns how many."""
    from onnx import helper
    producer = {out: k for k, node in enumerate(graph.node) for out in node.output}
    uses, floats = _consumers(graph), _float_outputs(graph)
    drop: Set[int] = set()
    replace: Dict[int, NodeProto] = {}
    for k, node in enumerate(graph.node):
        found = _scatter_chain(graph, node, producer, uses, floats)
        if found is None or found[0] in drop or found[1] in drop:
            continue
        s, m, base = found
        sc, mm = graph.node[s], graph.node[m]
        fused = helper.make_node(SCATTER_MATMUL_ADD, [sc.input[0], sc.input[1], mm.input[1], base],
                                 list(node.output), name=(node.name or sc.name) + "/irpe_fused_v",
                                 domain=DOMAIN)
        fused.attribute.extend(sc.attribute)
        drop.update((s, m))
        replace[k] = fused
    _rewrite(graph, drop, replace)
    return len(replace)


def _rewrite(graph: GraphProto, drop: Set[int], replace: Dict[int, NodeProto]) -> None:
    gone = {out for g in drop for out in graph.node[g].output}
    nodes = [replace.get(k, n) for k, n in enumerate(graph.node) if k not in drop]
    del graph.node[:]
    graph.node.extend(nodes)
    infos = [v for v in graph.value_info if v.name not in gone]
    del graph.value_info[:]
    graph.value_info.extend(infos)


def _softmax_on_last_axis(node: NodeProto, opset: int) -> bool:
    """A Softmax over the last axis of its 4-D input (the fused ops' output is 4-D)."""
    from onnx import helper
    axis = {a.name: helper.get_attribute_value(a) for a in node.attribute}.get(
        "axis", -1 if opset >= 13 else 1)
    return axis in (-1, 3)


def _v_partner(graph: GraphProto, name: str, softmax_at: int, producer: Dict[str, int],
               v_readers: Dict[str, List[int]]) -> int:
    """The index of the one RPEScatterMatMulAdd reading probabilities ``name`` as its input 0
    (its V index produced before ``softmax_at``); -1 when there is none or more than one."""
    found = v_readers.get(name, [])
    if len(found) != 1:
        return -1
    made_at = producer.get(graph.node[found[0]].input[1], -1)
    return found[0] if made_at < softmax_at else -1


def fuse_softmax(graph: GraphProto, opset: int = DEFAULT_OPSET, scatter: bool = True
                 ) -> Tuple[int, int]:
    """``Softmax(RPEGatherAdd*(...))`` -> ``RPEGatherAdd*Softmax`` (with ``scatter`` and an
    RPEScatterMatMulAdd on the probabilities: the *SoftmaxScatter form + RPEBucketMatMulAdd),
    in place; returns (fused softmaxes, of which with the V sums)."""
    from onnx import helper
    producer = {out: k for k, node in enumerate(graph.node) for out in node.output}
    uses = _consumers(graph)
    v_readers: Dict[str, List[int]] = {}  # probabilities -> the RPEScatterMatMulAdd nodes
    for k, node in enumerate(graph.node):
        if node.domain == DOMAIN and node.op_type == SCATTER_MATMUL_ADD:
            v_readers.setdefault(node.input[0], []).append(k)
    drop: Set[int] = set()
    replace: Dict[int, NodeProto] = {}
    with_v = 0
    for k, node in enumerate(graph.node):
        if (node.op_type != "Softmax" or node.domain not in ("", "ai.onnx") or
                not _softmax_on_last_axis(node, opset)):
            continue
        g = producer.get(node.input[0])
        if g is None or uses.get(node.input[0]) != 1 or g in drop:
            continue
        add = graph.node[g]
        if add.domain != DOMAIN or add.op_type not in (GATHER_ADD, GATHER_ADD2):
            continue
        v = _v_partner(graph, node.output[0], k, producer, v_readers) if scatter else -1
        inputs, outputs = list(add.input), list(node.output)
        attrs = list(add.attribute)
        if v >= 0:
            vnode = graph.node[v]
            sums = node.output[0] + "/irpe_v_sums"
            inputs.append(vnode.input[1])
            outputs.append(sums)
            buckets = {a.name: helper.get_attribute_value(a) for a in vnode.attribute}
            attrs.append(helper.make_attribute("scatter_buckets", int(buckets["num_buckets"])))
            bucket = helper.make_node(BUCKET_MATMUL_ADD, [sums, vnode.input[2], vnode.input[3]],
                                      list(vnode.output), name=vnode.name + "/sums",
                                      domain=DOMAIN)
            bucket.attribute.extend(vnode.attribute)
            replace[v] = bucket
            with_v += 1
        fused = helper.make_node(SOFTMAX_OPS[add.op_type, v >= 0], inputs, outputs,
                                 name=node.name + "/irpe_fused_softmax", domain=DOMAIN)
        fused.attribute.extend(attrs)
        drop.add(g)
        replace[k] = fused
    _rewrite(graph, drop, replace)
    return len(replace) - with_v, with_v


def fuse_gather_add(source: Union[str, bytes]) -> Tuple[Union[str, bytes], int]:
    """The model (path or bytes) with the gather pairs fused, as bytes, and the count; the
    source itself and 0 when there is nothing to fuse or the model cannot be handled here."""
    fused, counts = fuse_model(source, stages=("gather",))
    return fused, counts.gather


def _opset(model: ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def fuse_proto(model: ModelProto, stages: Collection[str] = STAGES) -> FuseCounts:
    """The fusions in ``stages`` (:data:`STAGES`) applied to ``model`` in place; their counts
    (zero, the model untouched, when it uses external data or no stage is asked for)."""
    from onnx.external_data_helper import uses_external_data
    if any(uses_external_data(t) for t in model.graph.initializer) or not stages:
        return FuseCounts()
    q = (relayout_q(model.graph, lambda name: _float_rank(model.graph, name),
                    _consumers(model.graph)) if "qlayout" in stages else 0)
    count = fuse_graph(model.graph) if "gather" in stages else 0
    if count:
        fuse_chains(model.graph)
    v = fuse_scatter(model.graph) if "scatter" in stages else 0
    soft, sums = (fuse_softmax(model.graph, _opset(model), scatter="scatter" in stages)
                  if "softmax" in stages else (0, 0))
    att = (fuse_attention(model.graph, _opset(model)) if "attention" in stages else 0)
    return FuseCounts(count, v, soft, sums, q, att)


def fuse_model(source: Union[str, bytes], stages: Collection[str] = STAGES
               ) -> Tuple[Union[str, bytes], FuseCounts]:
    """The model with the fusions in ``stages`` (:data:`STAGES`) applied, and their counts; the
    source itself and zero counts when nothing is fused or the model cannot be handled."""
    try:
        import onnx
        model = (onnx.load_from_string(source) if isinstance(source, bytes)
                 else onnx.load(source, load_external_data=False))
        counts = fuse_proto(model, stages)
        return ((model.SerializeToString(), counts)
                if counts.gather or counts.scatter or counts.qlayout or counts.attention
                else (source, FuseCounts()))
    except Exception as exc:  # leave the model to ONNX Runtime, which reports its own errors
        log.debug("no RPE fusion: %s", exc)
        return source, FuseCounts()
