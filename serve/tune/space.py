"""The configurations ``irpe tune`` may try: one :class:`Candidate` is one ``irpe serve``
setting of one model (backend, precision, batching, instances, threads, OpenVINO streams).

The space is a start (what ``irpe serve`` does with the file by default) plus axes, groups of
knobs that interact and are tried together: backend x precision, then batching (max batch x
queue delay), then parallelism (instances x threads x streams). The search
(:mod:`serve.tune.search`) walks the axes in that order from the best candidates so far, so
it never measures the full product (on 2 cores the product is ~100 configurations).
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, replace
from typing import Any, Dict, List, Optional, Sequence, Tuple

__all__ = ["Candidate", "Axis", "default_candidate", "axes", "cpu_flags", "PRECISIONS"]

PRECISIONS = ("fp32", "bf16", "int8")
# (max_batch_size, max_queue_delay_ms): batch 1 never waits; irpe serve's default is (8, 5)
BATCHING: Tuple[Tuple[int, float], ...] = ((1, 0.0), (4, 2.0), (8, 5.0), (8, 10.0), (16, 5.0),
                                           (16, 10.0), (32, 10.0))


@dataclass(frozen=True)
class Candidate:
    """One serving configuration of the tuned model, as the repository file sets it.

    ``precision`` int8 means the model file quantised by ``irpe quantize --target openvino``
    (an OpenVINO IR run with the fp32 hint); bf16 is the openvino / torch ``precision``
    setting. ``threads`` is the server's ``threads`` (0: the runtime's default); ``ov_streams``
    is the openvino backend's NUM_STREAMS (None for other backends; 0: OpenVINO's choice)."""

    backend: str
    precision: str = "fp32"
    max_batch_size: int = 8
    max_queue_delay_ms: float = 5.0
    instances: int = 1
    threads: int = 0
    ov_streams: Optional[int] = None

    def canonical(self) -> str:
        """The candidate as sorted JSON: the identity of its measurements."""
        return json.dumps(asdict(self), sort_keys=True)

    def key(self, context: str) -> str:
        """A short digest of the candidate and ``context`` (model file, machine, load)."""
        return hashlib.sha256(f"{self.canonical()}|{context}".encode()).hexdigest()[:16]

    def label(self) -> str:
        """A one-line name: 'openvino fp32 b8/5ms i1 t0 s1'."""
        streams = "" if self.ov_streams is None else f" s{self.ov_streams}"
        return (f"{self.backend} {self.precision} b{self.max_batch_size}/"
                f"{self.max_queue_delay_ms:g}ms i{self.instances} t{self.threads}{streams}")

    def with_(self, **changes: Any) -> "Candidate":
        """This candidate with ``changes``; ``ov_streams`` follows the backend (None off
        openvino, the server's default 1 on it when unset)."""
        out = replace(self, **changes)
        if out.backend != "openvino":
            return replace(out, ov_streams=None)
        return out if out.ov_streams is not None else replace(out, ov_streams=1)

    def as_dict(self) -> Dict[str, Any]:
        """The fields as a plain dict (the results file and the table)."""
        return asdict(self)


@dataclass(frozen=True)
class Axis:
    """A group of knobs tried together: ``name`` and the field changes of each option."""

    name: str
    options: Tuple[Tuple[Tuple[str, Any], ...], ...]

    def expand(self, seed: Candidate) -> List[Candidate]:
        """``seed`` with each option applied (valid ones only, duplicates once, seed first)."""
        out: List[Candidate] = [seed]
        for option in self.options:
            cand = seed.with_(**dict(option))
            if cand not in out and valid(cand):
                out.append(cand)
        return out


def valid(cand: Candidate) -> bool:
    """Whether ``irpe serve`` can run ``cand``: bf16 on openvino / torch, int8 on openvino
    (the quantised IR), streams only on openvino, batch 1 without a queue delay."""
    if cand.precision == "bf16" and cand.backend not in ("openvino", "torch"):
        return False
    if cand.precision == "int8" and cand.backend != "openvino":
        return False
    if cand.max_batch_size == 1 and cand.max_queue_delay_ms:
        return False
    return (cand.ov_streams is None) == (cand.backend != "openvino")


def default_candidate(backend: str) -> Candidate:
    """What ``irpe serve`` runs for a model without settings: batch 8 / 5 ms, one instance,
    the runtime's default threads, one OpenVINO stream (serve.config.OV_STREAMS)."""
    return Candidate(backend=backend).with_()


def cpu_flags() -> Tuple[str, ...]:
    """This CPU's flags (/proc/cpuinfo; empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return tuple(line.split(":", 1)[1].split())
    except OSError:
        pass
    return ()


def precisions_for(flags: Sequence[str], wanted: Sequence[str] = PRECISIONS) -> List[str]:
    """The ``wanted`` precisions this CPU runs fast: bf16 with AVX512_BF16 or AMX, int8 with
    VNNI (AVX512_VNNI or AVX_VNNI); fp32 always."""
    have = set(flags)
    ok = {"fp32": True, "bf16": bool({"avx512_bf16", "amx_bf16"} & have),
          "int8": bool({"avx512_vnni", "avx_vnni", "amx_int8"} & have)}
    return [p for p in wanted if ok.get(p)]


def axes(backends: Sequence[str], precisions: Sequence[str], cores: Optional[int] = None,
         batching: Sequence[Tuple[int, float]] = BATCHING) -> List[Axis]:
    """The axes of the search in the order they are walked: runtime (backend x precision),
    batching (max batch x delay), parallelism (instances x threads x streams for ``cores``)."""
    cores = cores or os.cpu_count() or 1
    runtime = tuple((("backend", b), ("precision", p)) for b in backends for p in precisions)
    batch = tuple((("max_batch_size", b), ("max_queue_delay_ms", float(d))) for b, d in batching)
    half = max(1, cores // 2)
    parallel = [(1, 0, 1), (1, cores, 1), (2, half, 1), (1, cores, 2), (1, 0, 0)]
    if cores >= 4:
        parallel.append((cores // 2, 2, 1))
    par = tuple((("instances", i), ("threads", t), ("ov_streams", s)) for i, t, s in parallel)
    return [Axis("runtime", runtime), Axis("batching", batch), Axis("parallelism", par)]
