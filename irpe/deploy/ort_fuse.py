"""Load-time fusion for the ONNX Runtime custom-op library: ``Add(x, RPEGather(t, i))`` ->
``RPEGatherAdd(t, i, x)``, one pass over the attention logits instead of two; two such in a row
(the iRPE-K and iRPE-Q terms) -> one ``RPEGatherAdd2``.

Applied by :func:`irpe.deploy.ort.create_session` to the model it hands to ONNX Runtime, only
when the CPU library is registered; the file on disk is never changed. A pair is fused when the
gather's output is float32, feeds that one Add and nothing else; anything unexpected (a file
onnx cannot parse, external data, no type information) leaves the model as it is.
"""
from __future__ import annotations

import logging
from typing import Dict, List, Tuple, Union

__all__ = ["FUSED_OP", "fuse_gather_add", "fuse_graph", "fuse_chains"]

log = logging.getLogger("irpe.deploy.ort")

FUSED_OP = "RPEGatherAdd"
_DOMAIN, _GATHER = "irpe", "RPEGather"


def _float_outputs(graph) -> set:
    """Names of float32 tensors the graph declares (value_info and outputs)."""
    from onnx import TensorProto
    return {v.name for v in list(graph.value_info) + list(graph.output)
            if v.type.tensor_type.elem_type == TensorProto.FLOAT}


def _consumers(graph) -> Dict[str, int]:
    uses: Dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            uses[name] = uses.get(name, 0) + 1
    for out in graph.output:
        uses[out.name] = uses.get(out.name, 0) + 1
    return uses


def _pairs(graph) -> List[Tuple[int, int, int]]:
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
            if (gather.domain == _DOMAIN and gather.op_type == _GATHER and
                    len(gather.input) == 2 and uses.get(name) == 1 and name in floats):
                found.append((g, k, side))
                break
    return found


def fuse_graph(graph) -> int:
    """Fuse every pair in ``graph`` (the main graph, in place); returns how many."""
    from onnx import helper
    pairs = _pairs(graph)
    drop = set()
    replace = {}
    for g, k, side in pairs:
        gather, add = graph.node[g], graph.node[k]
        fused = helper.make_node(FUSED_OP, [gather.input[0], gather.input[1], add.input[1 - side]],
                                 list(add.output), name=(add.name or gather.name) + "/irpe_fused",
                                 domain=_DOMAIN)
        fused.attribute.extend(gather.attribute)
        drop.add(g)
        replace[k] = fused  # at the Add's place: every input is produced before it
    _rewrite(graph, drop, replace)
    return len(pairs)


def fuse_chains(graph) -> int:
    """``RPEGatherAdd(t2, i2, RPEGatherAdd(t1, i1, x))`` -> ``RPEGatherAdd2(t1, i1, x, t2, i2)``
    (the iRPE-K then iRPE-Q terms: the logits pass once), in place; returns how many."""
    from onnx import helper
    producer = {out: k for k, node in enumerate(graph.node) for out in node.output}
    uses = _consumers(graph)
    drop, replace = set(), {}
    for k, node in enumerate(graph.node):
        if node.domain != _DOMAIN or node.op_type != FUSED_OP or k in drop:
            continue
        first = producer.get(node.input[2])
        if first is None or first in drop or first in replace or uses.get(node.input[2]) != 1:
            continue
        inner = graph.node[first]
        if inner.domain != _DOMAIN or inner.op_type != FUSED_OP:
            continue
        merged = helper.make_node(FUSED_OP + "2", list(inner.input) + list(node.input[:2]),
                                  list(node.output), name=node.name + "2", domain=_DOMAIN)
        merged.attribute.extend(inner.attribute)  # num_buckets: checked for the first table
        drop.add(first)
        replace[k] = merged
    _rewrite(graph, drop, replace)
    return len(replace)


def _rewrite(graph, drop: set, replace: dict) -> None:
    gone = {out for g in drop for out in graph.node[g].output}
    nodes = [replace.get(k, n) for k, n in enumerate(graph.node) if k not in drop]
    del graph.node[:]
    graph.node.extend(nodes)
    infos = [v for v in graph.value_info if v.name not in gone]
    del graph.value_info[:]
    graph.value_info.extend(infos)


def fuse_gather_add(source: Union[str, bytes]) -> Tuple[Union[str, bytes], int]:
    """The model (path or bytes) with the pairs fused, as bytes, and the count; the source
    itself and 0 when there is nothing to fuse or the model cannot be handled here."""
    try:
        import onnx
        from onnx.external_data_helper import uses_external_data
        model = (onnx.load_from_string(source) if isinstance(source, bytes)
                 else onnx.load(source, load_external_data=False))
        if any(uses_external_data(t) for t in model.graph.initializer):
            return source, 0
        count = fuse_graph(model.graph)
        if count:
            fuse_chains(model.graph)
        return (model.SerializeToString(), count) if count else (source, 0)
    except Exception as exc:  # leave the model to ONNX Runtime, which reports its own errors
        log.debug("no gather+Add fusion: %s", exc)
        return source, 0
