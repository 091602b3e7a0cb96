"""ONNX Runtime sessions for exported iRPE files: the custom-op library when it is there.

Every exported file runs anywhere through its model-local functions. Where the custom-op
library (plugins/onnxruntime -> ``build/plugins/libirpe_ort_ops.so``) is found, it is registered
and ONNX Runtime runs its RPEGather / RPEScatter kernels instead of the functions (ORT prefers a
registered op over a local function of the same domain and name). ONE log line per session says
which path serves the iRPE nodes. Used by serve's onnxruntime backend, ``irpe validate`` and the
benchmarks.

The switches are one typed, frozen :class:`OrtOptions` (custom-op mode, library file, graph
rewrite stages) that the caller passes; nothing here reads the environment except
:meth:`OrtOptions.from_env`, which the entry points (``irpe validate`` / ``evaluate``, the
benchmarks) call once; ``irpe serve`` takes them from its settings (docs/settings.md).
Mode ``auto`` (default) uses the library when found and falls back to the functions, with a
warning, when it cannot be loaded or a session cannot be made with it; ``on`` makes either an
error; ``off`` never loads it (the switch vocabulary of irpe.switch, older spellings such as
``1``/``0`` accepted). ``library`` names the library file (default: the checkout's
build/plugins/). With the CPU library, each ``Add(x, RPEGather(...))`` is loaded as one
``RPEGatherAdd`` node and each V term ``Add(x, MatMul(RPEScatter(...), W))`` as one
``RPEScatterMatMulAdd`` and a Softmax of such logits as one ``RPEGatherAdd*Softmax*``
(:mod:`irpe.runtime.graph.rewrites`; the file is not changed; ``rewrites`` empty turns
them off, a set such as ``{"gather", "scatter"}`` keeps only those stages).
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Any,
    Dict,
    FrozenSet,
    Iterable,
    List,
    Optional,
    Sequence,
    Tuple,
    Union,
)

from irpe.errors import InvalidInput, IrpeError
from irpe.plugin_files import BUILD_DIR
from irpe.runtime.base import options_from_env
from irpe.runtime.graph.rewrites import STAGES, parse_stages
from irpe.switch import Switch, parse_switch

if TYPE_CHECKING:
    from _typeshed import StrPath

__all__ = ["MODE_ENV", "LIBRARY_ENV", "FUSE_ENV", "CustomOpsError",
           "GPU_PROVIDERS", "OpsPath",
           "OrtOptions", "default_library", "resolve_mode", "find_library", "share_thread_pool",
           "session_options", "create_session"]

log = logging.getLogger("irpe.runtime.onnxruntime.session")

MODE_ENV = "IRPE_ORT_CUSTOM_OPS"
LIBRARY_ENV = "IRPE_ORT_OPS_LIBRARY"
FUSE_ENV = "IRPE_ORT_FUSE"  # "0": no load-time rewrite; else stages (rewrites.parse_stages)
_CPU_LIB, _CUDA_LIB = "libirpe_ort_ops.so", "libirpe_ort_ops_cuda.so"
# onnxruntime's GPU execution providers, in the priority order a session lists them (ORT's
# usual order: the TensorRT EP first, the CUDA EP for what it does not take); a session whose
# first provider is one of them gets the CUDA build of the custom-op library
GPU_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider")
_shared_pool: Optional[int] = None  # intra-op threads of the process-wide pool, once made


class CustomOpsError(IrpeError, RuntimeError):
    """The custom-op library was required (mode ``on``) and cannot serve."""


@dataclass(frozen=True)
class OpsPath:
    """Which path runs the iRPE nodes of a session, and why."""

    custom_ops: bool
    library: Optional[str]
    reason: str
    fused: int = 0  # Add(x, RPEGather) pairs run as one RPEGatherAdd
    fused_v: int = 0  # Add(x, MatMul(RPEScatter, W)) chains run as one RPEScatterMatMulAdd
    fused_softmax: int = 0  # Softmax(RPEGatherAdd*) run as one RPEGatherAdd*Softmax*
    q_layout: int = 0  # iRPE-Q tables computed bucket-major (rewrite_qlayout)
    attention: int = 0  # attention blocks run as one RPEAttention (rewrite_attention)

    def describe(self) -> str:
        """One line for logs and reports."""
        if self.custom_ops:
            parts = [f"{self.fused} gather+Add"] if self.fused else []
            parts += [f"{self.fused_v} scatter+MatMul+Add"] if self.fused_v else []
            parts += [f"{self.fused_softmax} Softmax"] if self.fused_softmax else []
            parts += [f"{self.attention} attention blocks"] if self.attention else []
            extra = f" ({', '.join(parts)} fused)" if parts else ""
            extra += f" ({self.q_layout} Q tables bucket-major)" if self.q_layout else ""
            return f"iRPE ops: custom-op library {self.library}{extra}"
        return f"iRPE ops: ONNX functions ({self.reason})"


def default_library(cuda: bool = False) -> Path:
    """Where the build puts the library (used when :class:`OrtOptions` names none)."""
    return BUILD_DIR / (_CUDA_LIB if cuda else _CPU_LIB)


def resolve_mode(mode: Optional[str] = None) -> Switch:
    """The mode checked and normalised (irpe.switch.parse_switch: auto, on, off, older
    spellings such as 1/0 accepted); None: ``auto``."""
    return "auto" if mode is None else parse_switch(mode, "custom-ops mode")


def _stages(stages: Union[str, Iterable[str]]) -> FrozenSet[str]:
    """Rewrite stages from a setting string (rewrites.parse_stages) or a collection; checked:
    an unknown stage is the user's setting (InvalidInput, a ValueError)."""
    try:
        return (parse_stages(stages) if isinstance(stages, str)
                else parse_stages(",".join(stages) or "0"))
    except ValueError as exc:  # parse_stages raises it for an unknown stage name only
        raise InvalidInput(str(exc)) from None


@dataclass(frozen=True)
class OrtOptions:
    """How :func:`create_session` runs the iRPE nodes: custom-op ``custom_ops`` mode
    (auto/on/off), the ``library`` file (None: :func:`default_library`) and the load-time graph
    ``rewrites`` stages (all of rewrites.STAGES by default). Checked when made."""

    custom_ops: str = "auto"  # any spelling irpe.switch reads; kept as auto, on or off
    library: Optional[Path] = None
    rewrites: FrozenSet[str] = field(default_factory=lambda: frozenset(STAGES))

    def __post_init__(self) -> None:
        object.__setattr__(self, "custom_ops", resolve_mode(self.custom_ops))
        if self.library is not None:
            object.__setattr__(self, "library", Path(self.library).expanduser())
        object.__setattr__(self, "rewrites", _stages(self.rewrites))

    @classmethod
    def from_env(cls) -> "OrtOptions":
        """The options of ``$IRPE_ORT_CUSTOM_OPS``, ``$IRPE_ORT_OPS_LIBRARY`` and
        ``$IRPE_ORT_FUSE`` (unset: the defaults): the ONE place they are read; a bad value
        raises InvalidInput (a ValueError) naming the variable. Entry points call it once."""
        return options_from_env(cls(), {
            "custom_ops": (MODE_ENV, os.environ.get(MODE_ENV)),
            "library": (LIBRARY_ENV, os.environ.get(LIBRARY_ENV)),
            "rewrites": (FUSE_ENV, os.environ.get(FUSE_ENV))}, ("custom_ops", "rewrites"))

    def with_(self, custom_ops: Optional[str] = None, library: Optional[StrPath] = None,
              rewrites: Optional[Union[str, Iterable[str]]] = None) -> "OrtOptions":
        """These options with the given (not None) ones replaced (CLI flags over settings)."""
        given: Dict[str, Any] = {"custom_ops": custom_ops, "library": library,
                                 "rewrites": rewrites}  # parsed by __post_init__
        return replace(self, **{k: v for k, v in given.items() if v is not None})


def _wants_cuda(providers: Sequence[Union[str, tuple]]) -> bool:
    names = [p if isinstance(p, str) else p[0] for p in providers or ()]
    return bool(names) and names[0] in GPU_PROVIDERS


def _wanted(library: Optional[StrPath], cuda: bool) -> StrPath:
    """The library asked for: the argument or the build folder's."""
    return library or default_library(cuda)


def find_library(library: Optional[StrPath] = None, cuda: bool = False) -> Optional[Path]:
    """The library to load: the argument or the build folder's; ``None`` when that file does
    not exist."""
    path = Path(_wanted(library, cuda)).expanduser()
    return path if path.is_file() else None


def share_thread_pool(threads: int) -> bool:
    """Makes ONE process-wide ONNX Runtime intra-op pool of ``threads`` threads for every session
    this module makes from then on. Sessions timed side by side then do not meet each other's
    idle workers, which spin for tens of ms after a run (docs/export.md). Process-wide and for
    good: ONNX Runtime then refuses a session with a pool of its own, so call it only in a
    process whose sessions all come from here (the benchmarks, ``irpe serve``). False when the
    pool exists with another size or could not be made."""
    global _shared_pool
    if _shared_pool is not None:
        return _shared_pool == int(threads)
    import onnxruntime as ort
    try:
        ort.set_global_thread_pool_sizes(int(threads), 1)
    except Exception as exc:  # made before, outside this module: "cannot replace them"
        log.warning("no shared thread pool: %s", _first_line(exc))
        return False
    _shared_pool = int(threads)
    return True


def session_options(ort: Any, threads: Optional[int] = None) -> Any:
    """SessionOptions on the shared pool once there is one (:func:`share_thread_pool`), else
    with a pool of ``threads`` intra-op threads (inter-op 1) when given."""
    options = ort.SessionOptions()
    if _shared_pool is not None:
        options.use_per_session_threads = False
    elif threads:
        options.intra_op_num_threads, options.inter_op_num_threads = int(threads), 1
    return options


def _register(ort: Any, options: Any, library: Path) -> None:
    try:
        options.register_custom_ops_library(str(library))
    except Exception as exc:  # onnxruntime raises its own exception types
        raise CustomOpsError(f"cannot load {library}: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _plan(ort: Any, mode: str, library: Optional[StrPath], cuda: bool,
          threads: Optional[int]) -> Tuple[Any, OpsPath]:
    """Options with the library registered, or without it and the reason."""
    options = session_options(ort, threads)
    if mode == "off":
        return options, OpsPath(False, None, "custom ops off (setting)")
    found = find_library(library, cuda)
    if found is None:
        why = f"no custom-op library at {_wanted(library, cuda)}"
        if cuda and library is None:
            why += " (a GPU provider needs the CUDA build, libirpe_ort_ops_cuda.so)"
        if mode == "on":
            raise CustomOpsError(why + "; build it with plugins/onnxruntime/build.sh")
        return options, OpsPath(False, None, why)
    try:
        _register(ort, options, found)
    except CustomOpsError as exc:
        if mode == "on":
            raise
        log.warning("%s; using the ONNX functions", exc)
        return session_options(ort, threads), OpsPath(False, None, str(exc))
    return options, OpsPath(True, str(found), "registered")


def _fused_source(source: Union[str, bytes], path: OpsPath, stages: FrozenSet[str]
                  ) -> Tuple[Union[str, bytes], OpsPath]:
    """With the CPU library: the model with the RPE ops fused at load
    (irpe.runtime.graph.rewrites), rewrite stages ``stages``."""
    if not path.custom_ops:
        return source, path
    from irpe.runtime.graph.rewrites import fuse_model
    if not stages:
        return source, path
    fused, counts = fuse_model(source, stages)
    if not (counts.gather or counts.scatter or counts.qlayout or counts.attention):
        return source, path
    return fused, OpsPath(True, path.library, path.reason, counts.gather, counts.scatter,
                          counts.softmax, counts.qlayout, counts.attention)


def create_session(model: Union[StrPath, bytes], providers: Optional[List] = None, *,
                   threads: Optional[int] = None, options: Optional[OrtOptions] = None,
                   custom_ops: Optional[str] = None, library: Optional[StrPath] = None,
                   quiet: bool = False, rewrites: Optional[Union[str, Iterable[str]]] = None
                   ) -> Tuple[Any, OpsPath]:
    """An ``InferenceSession`` for ``model`` (path or bytes) and the iRPE ops path it uses, run
    as ``options`` say (default ``OrtOptions()``); ``custom_ops`` / ``library`` /
    ``rewrites`` given replace those of ``options``. Reads no environment variable."""
    import onnxruntime as ort
    chosen = (options or OrtOptions()).with_(custom_ops, library, rewrites)
    mode = chosen.custom_ops
    providers = list(providers or ["CPUExecutionProvider"])
    source = model if isinstance(model, bytes) else str(model)
    cuda = _wants_cuda(providers)
    session_opts, path = _plan(ort, mode, chosen.library, cuda, threads)
    try:
        fused, path = (_fused_source(source, path, chosen.rewrites) if not cuda
                       else (source, path))
        session = ort.InferenceSession(fused, session_opts, providers=providers)
    except Exception as exc:
        if not path.custom_ops or mode == "on":
            if path.custom_ops:
                raise CustomOpsError(f"session with {path.library}: {_first_line(exc)}") from None
            raise
        log.warning("session with %s failed (%s); retrying with the ONNX functions",
                    path.library, _first_line(exc))
        path = OpsPath(False, None, f"session with the library failed: {_first_line(exc)}")
        session = ort.InferenceSession(source, session_options(ort, threads), providers=providers)
    if not quiet:
        log.info("onnxruntime %s", path.describe())
    return session, path
