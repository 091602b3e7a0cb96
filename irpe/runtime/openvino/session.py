"""OpenVINO on the CPU for exported iRPE files and OpenVINO IRs: options, reading, compiling.

Used by serve's openvino backend, ``irpe validate --runtime openvino`` and ``irpe eval
--runtime openvino``. The switches are one frozen, checked :class:`OvOptions` the caller passes
(precision, threads, streams, performance hint); nothing here reads the environment.

Precision is always set. OpenVINO's CPU plugin runs in bf16 by default on a CPU with BF16
(``INFERENCE_PRECISION_HINT`` reads bfloat16 on AVX-512 BF16 / AMX machines), so a model
compiled without a hint gives other numbers on other machines. :func:`compile_model` therefore
sets ``f32`` or ``bf16`` explicitly, refuses bf16 where the CPU lacks it (OpenVINO would fall
back to f32 without a word) and reads the precision back from the compiled model.

An exported ``.onnx`` is read with its iRPE nodes run by the iRPE OpenVINO library where it
is built (:mod:`irpe.runtime.openvino.library`: its attention blocks rewritten in memory to the
library's RPEAttention), else lowered by :mod:`irpe.runtime.openvino.frontend`'s conversions;
nothing is written next to the file. An OpenVINO IR (``.xml`` + ``.bin``, ``irpe quantize
--target openvino``) is read as it is; one that holds the library's ops needs the library.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Dict, Optional, Sequence, Tuple, Union

from irpe.artifact.filecheck import check_file
from irpe.artifact.names import is_ir
from irpe.errors import InvalidInput
from irpe.runtime.base import options_from_env
from irpe.switch import parse_switch

from .core import DEVICE, import_openvino, ov_message, read_checked
from .library import finish_library, plan_library

if TYPE_CHECKING:
    import openvino

__all__ = ["PRECISIONS", "HINTS", "OPS_ENV", "LIBRARY_ENV", "OvOptions", "open_model",
           "read_model", "compile_model", "compiled_precision"]

PRECISIONS = {"fp32": "f32", "bf16": "bf16"}  # our names -> INFERENCE_PRECISION_HINT values
HINTS = ("latency", "throughput")  # PERFORMANCE_HINT, lower case
OPS_ENV = "IRPE_OV_OPS"  # the library mode of the entry points (OvOptions.from_env)
LIBRARY_ENV = "IRPE_OV_OPS_LIBRARY"
_NAMES = {value: key for key, value in PRECISIONS.items()}


@dataclass(frozen=True)
class OvOptions:
    """How :func:`compile_model` compiles: ``precision`` fp32 | bf16 (always set explicitly),
    ``threads`` (INFERENCE_NUM_THREADS; 0: OpenVINO's default, the process's cores),
    ``streams`` (NUM_STREAMS; 0: what the hint picks), ``performance_hint`` latency |
    throughput, ``ops`` the iRPE OpenVINO library's mode auto | on | off and ``library`` its
    file ("": build/plugins/; irpe.runtime.openvino.library). Checked when made: a bad value is
    a ValueError of one line."""

    precision: str = "fp32"
    threads: int = 0
    streams: int = 0
    performance_hint: str = "latency"
    ops: str = "auto"
    library: str = ""

    def __post_init__(self) -> None:
        precision = str(self.precision).strip().lower()
        if precision not in PRECISIONS:
            raise InvalidInput(f"openvino precision must be one of {', '.join(PRECISIONS)}, got "
                             f"{self.precision!r}")
        hint = str(self.performance_hint).strip().lower()
        if hint not in HINTS:
            raise InvalidInput(f"openvino performance hint must be one of {', '.join(HINTS)}, "
                             f"got {self.performance_hint!r}")
        for name in ("threads", "streams"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidInput(f"openvino {name} must be an integer >= 0 (0: OpenVINO's "
                                 f"choice), got {value!r}")
        object.__setattr__(self, "precision", precision)
        object.__setattr__(self, "performance_hint", hint)
        object.__setattr__(self, "ops", parse_switch(str(self.ops), "openvino ops mode"))
        object.__setattr__(self, "library", os.fspath(self.library).strip())

    @classmethod
    def from_env(cls) -> "OvOptions":
        """The options of ``$IRPE_OV_OPS`` and ``$IRPE_OV_OPS_LIBRARY`` (unset: the defaults):
        the one place they are read; a bad value is InvalidInput naming the variable. Entry
        points (``irpe validate`` / ``eval``, the benchmarks) call it once."""
        return options_from_env(cls(), {"ops": (OPS_ENV, os.environ.get(OPS_ENV)),
                                        "library": (LIBRARY_ENV, os.environ.get(LIBRARY_ENV))})

    def with_(self, precision: Optional[str] = None, threads: Optional[int] = None,
              streams: Optional[int] = None, performance_hint: Optional[str] = None,
              ops: Optional[str] = None, library: Optional[str] = None) -> "OvOptions":
        """These options with the given (not None) ones replaced (flags over settings)."""
        given: Dict[str, Any] = {"precision": precision, "threads": threads,
                                 "streams": streams, "performance_hint": performance_hint,
                                 "ops": ops, "library": library}
        return replace(self, **{k: v for k, v in given.items() if v is not None})

    def config(self) -> Dict[str, Any]:
        """The compile configuration: precision and hint always, threads / streams when set."""
        out: Dict[str, Any] = {"INFERENCE_PRECISION_HINT": PRECISIONS[self.precision],
                               "PERFORMANCE_HINT": self.performance_hint.upper()}
        if self.threads:
            out["INFERENCE_NUM_THREADS"] = self.threads
        if self.streams:
            out["NUM_STREAMS"] = self.streams
        return out


def open_model(path: Union[str, "os.PathLike[str]"], options: Optional[OvOptions] = None
               ) -> Tuple["openvino.Model", "openvino.Core", str]:
    """The model in ``path`` (an exported ``.onnx`` or an IR ``.xml`` with its ``.bin``), the
    Core that read it (compile with that one) and how its iRPE nodes run, per ``options``'
    library mode and precision (bf16 on a CPU without BF16 is refused here). A missing or
    unreadable file is one line (InvalidInput / MissingFile); an IR holding the library's ops
    without the library is an OvLibraryError."""
    options = options or OvOptions()
    path = os.fspath(path)
    check_file(path, "ir" if is_ir(path) else "onnx")
    plan = plan_library(path, options.ops, options.library)  # type: ignore[arg-type]
    model, ov_core, capabilities = read_checked(plan.library, plan.source, path,
                                                options.precision)
    return model, ov_core, finish_library(model, plan, options.precision, capabilities)


def read_model(path: Union[str, "os.PathLike[str]"], options: Optional[OvOptions] = None
               ) -> "openvino.Model":
    """The model in ``path`` as :func:`open_model` reads it."""
    return open_model(path, options)[0]


def compiled_precision(compiled: "openvino.CompiledModel") -> str:
    """The precision a compiled model runs in, read back from it (fp32 / bf16 / f16 ...)."""
    element = compiled.get_property("INFERENCE_PRECISION_HINT")
    name = element.get_type_name() if hasattr(element, "get_type_name") else str(element)
    return _NAMES.get(name, name)


def compile_model(path: Union[str, "os.PathLike[str]"], options: Optional[OvOptions] = None,
                  shapes: Optional[Dict[str, Sequence[int]]] = None
                  ) -> Tuple["openvino.CompiledModel", str]:
    """``path`` (see :func:`read_model`) compiled for the CPU as ``options`` say (default
    ``OvOptions()``: fp32), and one line describing it: OpenVINO version, the precision,
    threads, streams and hint read back from the compiled model, and how the iRPE nodes run.
    bf16 on a CPU without BF16, or a compiled precision other than the one asked for, is a
    ValueError. ``shapes``: the inputs' shapes fixed before compiling (a benchmark's one batch
    shape, which OpenVINO then plans for); default: the file's dynamic axes."""
    ov = import_openvino()
    options = options or OvOptions()
    model, ov_core, irpe_path = open_model(path, options)
    if shapes:
        model.reshape({name: list(shape) for name, shape in shapes.items()})
    try:
        compiled = ov_core.compile_model(model, DEVICE, options.config())
    except RuntimeError as exc:
        raise InvalidInput(f"{os.fspath(path)}: OpenVINO cannot compile it: "
                         f"{ov_message(exc)}") from None
    precision = compiled_precision(compiled)
    if precision != options.precision:
        raise InvalidInput(f"{os.fspath(path)}: OpenVINO compiled it in {precision}, not in "
                         f"{options.precision} as asked")
    line = (f"openvino {ov.__version__.split('-')[0]} {DEVICE}: {precision}, threads "
            f"{compiled.get_property('INFERENCE_NUM_THREADS')}, streams "
            f"{compiled.get_property('NUM_STREAMS')}, hint "
            f"{str(compiled.get_property('PERFORMANCE_HINT')).lower()}; iRPE ops: {irpe_path}")
    return compiled, line
