"""The iRPE OpenVINO extension library (plugins/openvino -> ``build/plugins/libirpe_openvino.so``,
``make ov-ops``): finding and loading it, and the attention fusion it runs.

The library registers three OpenVINO operations of opset ``irpe`` and their ONNX-frontend
mappings: ``RPEGather`` and ``RPEScatter`` (the exported nodes, with the ONNX Runtime library's
row kernels) and ``RPEAttention`` (a whole timm/DeiT attention block with its iRPE terms: the
ONNX Runtime library's attention kernel). An exported file is read through the ONNX Runtime
library's own graph rewrite (:func:`irpe.runtime.graph.rewrites.fuse_model`, in memory;
the file is never changed) when every iRPE node then is one the library runs; else, with the V
term, as it is (its RPEGather / RPEScatter nodes on the library's kernels); else through the
frontend conversions, where OpenVINO's own kernels are as fast (:func:`library_source`).
OpenVINO's fused attention cannot
take the probabilities out for the V term, and the gathered bias costs a pass over memory per
block; the library's attention keeps both in cache (docs/DECISIONS.md, "OpenVINO library").

Mode (:class:`irpe.runtime.openvino.session.OvOptions`, the product's switch vocabulary):
``auto`` loads the library where it is built and falls back to the frontend conversions
(:mod:`irpe.runtime.openvino.frontend`) with a warning when it cannot be loaded; ``on`` makes
either an error; ``off`` never loads it.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence, Tuple, Union

from irpe.artifact.names import is_ir, weights_path
from irpe.artifact.openvino_ir import library_ops
from irpe.artifact.ops import ATTENTION, DOMAIN, OPENVINO_LIBRARY_OPS, OPENVINO_OPSET, SCATTER
from irpe.errors import CLIError, MissingFile
from irpe.plugin_files import BUILD_DIR
from irpe.switch import Switch

from .core import core
from .frontend import LOWERING

if TYPE_CHECKING:
    import openvino

__all__ = ["LIBRARY", "OPENVINO_LIBRARY_OPS", "BUILD_COMMAND", "OvLibraryError",
           "default_library", "resolve_library", "library_source", "attention_precision",
           "set_attention_precision", "attention_products", "LibraryPlan", "plan_library",
           "finish_library"]

log = logging.getLogger("irpe.runtime.openvino")

LIBRARY = "libirpe_openvino.so"
BUILD_COMMAND = "make ov-ops"


class OvLibraryError(CLIError, RuntimeError):
    """The library was required (mode ``on``, or an IR that holds its ops) and cannot serve."""


def default_library() -> Path:
    """Where ``make ov-ops`` puts the library (used when the options name none)."""
    return BUILD_DIR / LIBRARY


def _loads(path: str) -> Optional[str]:
    """None when OpenVINO loads the library at ``path``, else OpenVINO's reason in one line."""
    try:
        core(path)
    except RuntimeError as exc:
        return " ".join(str(exc).split())[:300]
    return None


def resolve_library(mode: Switch, library: str = "") -> Tuple[Optional[str], str]:
    """The library file to load for ``mode`` (None: the frontend conversions) and why. ``on``
    with no loadable library raises :class:`OvLibraryError`; ``auto`` falls back, logging a
    warning when a library is there but does not load."""
    if mode == "off":
        return None, "library off"
    path = os.path.abspath(library) if library else str(default_library())
    if not os.path.isfile(path):
        why = f"{path} not built ({BUILD_COMMAND})"
        if mode == "on":
            raise OvLibraryError(f"the iRPE OpenVINO library is required but {why}")
        return None, why
    failed = _loads(path)
    if failed is not None:
        if mode == "on":
            raise OvLibraryError(f"the iRPE OpenVINO library {path} does not load: {failed}")
        log.warning("the iRPE OpenVINO library %s does not load (%s); converting the iRPE "
                    "nodes instead", path, failed)
        return None, f"{path} does not load"
    return path, "library"


def library_source(path: str, force: bool = False
                   ) -> Tuple[Optional[Union[str, bytes]], int]:
    """What the library reads of the exported file, where it wins, and how many attention
    blocks it fuses: the file's attention blocks rewritten to ``RPEAttention`` (bytes) when
    every iRPE node left is one of :data:`OPENVINO_LIBRARY_OPS`; else ``path`` itself when the
    file has the V term (RPEScatter: the library's bucket sums against a reference
    ScatterElementsUpdate); else None: the frontend conversions. From measurement
    (docs/DECISIONS.md): without iRPE terms OpenVINO's own fused attention is as fast in fp32
    and faster in int8; a K/Q-only file that does not fuse runs OpenVINO's JIT Gather as fast
    as the library's. The fused blocks' precision is set once read
    (:func:`set_attention_precision`). ``force`` (mode ``on``): the library whether or not it
    wins, never None."""
    import onnx

    from irpe.runtime.graph.rewrites import FuseCounts, fuse_proto
    try:  # parsed once: the rewrite works on this proto in place
        model = onnx.load(path, load_external_data=False)
    except Exception:  # noqa: BLE001 - OpenVINO reads it next and names the problem
        return path, 0
    ops = [n.op_type for n in model.graph.node if n.domain == DOMAIN]
    v_term = SCATTER in ops or force
    if not ops:
        return (path, 0) if force else (None, 0)
    try:
        counts = fuse_proto(model)
    except Exception:  # noqa: BLE001 - a graph the rewrite does not handle: read as it is
        counts = FuseCounts()
    if counts.attention and not any(n.domain == DOMAIN
                                    and n.op_type not in OPENVINO_LIBRARY_OPS
                                    for n in model.graph.node):
        return model.SerializeToString(), counts.attention
    return (path, 0) if v_term else (None, 0)


def attention_precision(precision: str) -> str:
    """The ``precision`` attribute of the library's ``RPEAttention`` for a model run at
    ``precision`` (fp32 | bf16 | int8): its products (q k^T, p v and the iRPE tables) in
    bfloat16 with float32 sums for bf16 and int8 where the CPU has AVX512_BF16 (else float32),
    as OpenVINO runs its own attention in bf16 there and in int8 in an NNCF model; float32
    for fp32 (docs/DECISIONS.md, "bf16 products")."""
    return "bf16" if precision in ("bf16", "int8") else "f32"


def set_attention_precision(model: "openvino.Model", precision: str) -> int:
    """Every ``RPEAttention`` of ``model`` (in place) set to :func:`attention_precision` of
    ``precision``; returns how many (an IR written after this keeps the attribute)."""
    ops = _attention_ops(model)
    for op in ops:
        op.set_attribute("precision", attention_precision(precision))
    return len(ops)


def _attention_ops(model: "openvino.Model") -> list:
    """The library's ``RPEAttention`` ops of ``model`` (opset ``irpe``)."""
    return [op for op in model.get_ops()
            if op.get_type_name() == ATTENTION and op.get_type_info().version_id == OPENVINO_OPSET]


def attention_products(model: "openvino.Model") -> Optional[str]:
    """The precision of ``model``'s ``RPEAttention`` products: ``bf16`` where any asks for it,
    else ``f32``; None without such ops."""
    found = [str(op.get_attributes().get("precision", "f32")) for op in _attention_ops(model)]
    return None if not found else "bf16" if "bf16" in found else "f32"


@dataclass(frozen=True)
class LibraryPlan:
    """How a file is read for the library mode asked: ``library`` the file to load (None: the
    frontend conversions), ``source`` read_model's arguments, ``blocks`` the attention blocks
    fused from an exported file, ``how`` the iRPE line where the library does not run it."""

    library: Optional[str]
    source: Tuple[Any, ...]
    blocks: int = 0
    how: str = ""


def plan_library(path: str, mode: Switch, library: str = "") -> LibraryPlan:
    """The :class:`LibraryPlan` of ``path`` (an exported ``.onnx`` or an IR) in ``mode``: an IR
    is read as stored (one holding the library's ops needs the library: OvLibraryError); an
    exported file through :func:`library_source` where the library wins."""
    found, why = resolve_library(mode, library)
    if is_ir(path):
        weights = weights_path(path)
        if not os.path.isfile(weights):
            raise MissingFile(f"{path}: its weights file {weights} is missing")
        needs = library_ops(path)
        if needs and found is None:
            raise OvLibraryError(f"{path} holds the iRPE OpenVINO library's ops ({', '.join(needs)}"
                                 f"), which cannot load here: {why}; {BUILD_COMMAND} builds it")
        return LibraryPlan(found, (path, weights), 0, "" if needs else "as stored in the IR")
    read, blocks = library_source(path, force=mode == "on") if found else (None, 0)
    if found and read is None:
        found, why = None, "OpenVINO's own kernels win for this file"
    source = (read, b"") if blocks else (path,)
    return LibraryPlan(found, source, blocks, "" if found else f"{LOWERING} ({why})")


def finish_library(model: "openvino.Model", plan: LibraryPlan, precision: str,
                   capabilities: Sequence[str]) -> str:
    """The fused blocks of ``model`` set to ``precision`` (:func:`set_attention_precision`) and
    the line saying how its iRPE nodes run: the library's file, the blocks fused, and the
    precision of the attention products where they are bf16 (which needs BF16 here)."""
    if plan.blocks:
        set_attention_precision(model, precision)
    if plan.how:
        return plan.how
    details = [f"{plan.blocks} attention blocks fused"] if plan.blocks else []
    if attention_products(model) == "bf16":
        details.append("products in bf16" if "BF16" in capabilities
                       else "products in float32: no BF16 on this CPU")
    return f"library {os.path.basename(str(plan.library))}" + (
        f" ({', '.join(details)})" if details else "")

