"""Export an iRPE model to ONNX: :func:`export_onnx`, the one entry point (``irpe export``, the
Triton repository writer, serve's demo through irpe.artifact.exporters, the tests).

One file for every runtime: a ``irpe::RPEGather`` / ``irpe::RPEScatter`` node per iRPE op, each
with a model-local function of standard ops (export.trace builds the graph). The steps, in
order: refuse an output that is an input and an unsupported opset (before any work), load the
model (export.source), build the graph (export.trace), write the file atomically (irpe.atomic).
"""
from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional, TextIO, Union

from irpe.artifact.contract import DEFAULT_OPSET, MAX_OPSET, MIN_OPSET
from irpe.artifact.trained import ModelSpec
from irpe.atomic import write_bytes
from irpe.errors import InvalidInput
from irpe.outputs import check_outputs

from .source import SourceLike, load_source
from .trace import Step, output_module, trace_model

__all__ = ["export_onnx", "output_module"]  # output_module: export.trace's, for validation


def _timer(enabled: bool) -> Step:
    """A :data:`export.trace.Step` that prints each step's seconds on stderr when enabled."""
    @contextmanager
    def step(label: str) -> Iterator[None]:
        t0 = time.perf_counter()
        yield
        if enabled:
            print(f"[export] {label:<34} {time.perf_counter() - t0:7.2f} s", file=sys.stderr,
                  flush=True)
    return step


def export_onnx(source: SourceLike, output: Union[str, os.PathLike],
                checkpoint: Optional[str] = None, *, inline: bool = False,
                opset: int = DEFAULT_OPSET, progress: bool = False,
                spec: Optional[ModelSpec] = None, optimize: bool = True,
                summary: Optional[TextIO] = None) -> Path:
    """Export ``source`` to the ONNX file ``output``; its path.

    ``source``: a registry name (weights from ``checkpoint``, else its bundled ones, else random
    with a warning), a trained-model .safetensors file, or an nn.Module with ``spec``.
    ``opset``: irpe.artifact.contract's MIN_OPSET..MAX_OPSET. ``inline``: functions expanded
    into the graph instead of custom nodes. ``optimize``: constant folding (onnxscript).
    ``progress``: step timings on stderr. ``summary``: a stream for the one line describing the
    file written (what ``irpe export`` prints; taken from what was written, not read back).
    Before any work: an output that is the source or checkpoint file (SameFileError) and an
    opset out of range (InvalidInput) are refused. The file appears complete or not at all."""
    start, step = time.perf_counter(), _timer(progress)
    inputs = [f for f in (source, checkpoint)
              if isinstance(f, (str, os.PathLike)) and os.path.isfile(f)]
    check_outputs([output], inputs)
    if not MIN_OPSET <= opset <= MAX_OPSET:  # the opsets the exporter writes (the contract's)
        raise InvalidInput(f"opset {opset} is not supported; choose {MIN_OPSET}..{MAX_OPSET}")
    with step("load model"):
        src = load_source(source, checkpoint, spec)
    if progress:
        print(f"[export] {src.spec.model_name} ({src.spec.task}), weights {src.weights}",
              file=sys.stderr)
    model = trace_model(src, opset, inline=inline, optimize=optimize, step=step)
    props = {p.key: p.value for p in model.metadata_props}
    path = Path(output)
    with step(f"write {path.name}"):
        write_bytes(path, model.SerializeToString())  # complete, metadata included, or nothing
    size = path.stat().st_size / 1e6
    if progress:
        print(f"[export] total {time.perf_counter() - start:.2f} s, {size:.1f} MB, "
              f"rpe nodes {props['irpe.rpe_nodes']}", file=sys.stderr)
    if summary is not None:
        print(f"wrote {path} ({size:.1f} MB): {props['irpe.model_name']}, opset "
              f"{props['irpe.opset']}, rpe nodes {props['irpe.rpe_nodes']}"
              f"{' (inlined)' if inline else ''}, weights {props['irpe.weights']}", file=summary)
    return path
