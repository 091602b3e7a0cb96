"""irpe: image relative position encoding (Wu et al., ICCV 2021) for deployment.

The iRPE math (bucket ids, encodings, custom ops) lives here once; export/, serve/, plugins/
and benchmarks/ import it.

The names below are imported on first use (PEP 562), not with the package: ``import irpe``
costs nothing until a name is used, so the ``irpe`` command (:mod:`irpe.console`) is in its
Ctrl-C handling before torch is imported (a Ctrl-C during those seconds was a traceback).
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Dict

if TYPE_CHECKING:  # the same names, for type checkers
    from .bucket import Method, bucket_ids, bucket_ids_traceable, num_buckets, piecewise_index
    from .checkpoint import CheckpointError, load_checkpoint, read_state_dict, save_checkpoint
    from .models import create_model, list_models, model_info
    from .ops import rpe_gather, rpe_scatter
    from .rpe import (
        RPEConfig,
        build_rpe,
        get_rpe_config,
        iRPE,
        iRPECross,
        randomize_tables,
        set_traceable,
    )

__version__ = "0.1.0"  # the package's one version: pyproject.toml reads it (dynamic)

# public name -> the module that defines it
_HOMES: Dict[str, str] = {
    **dict.fromkeys(("Method", "bucket_ids", "bucket_ids_traceable", "num_buckets",
                     "piecewise_index"), ".bucket"),
    **dict.fromkeys(("CheckpointError", "load_checkpoint", "read_state_dict", "save_checkpoint"),
                    ".checkpoint"),
    **dict.fromkeys(("create_model", "list_models", "model_info"), ".models"),
    **dict.fromkeys(("rpe_gather", "rpe_scatter"), ".ops"),
    **dict.fromkeys(("RPEConfig", "build_rpe", "get_rpe_config", "iRPE", "iRPECross",
                     "set_traceable", "randomize_tables"), ".rpe"),
}

__all__ = [
    "Method", "bucket_ids", "bucket_ids_traceable", "num_buckets", "piecewise_index",
    "CheckpointError", "load_checkpoint", "read_state_dict", "save_checkpoint",
    "create_model", "list_models", "model_info", "rpe_gather", "rpe_scatter",
    "RPEConfig", "build_rpe", "get_rpe_config", "iRPE", "iRPECross", "set_traceable",
    "randomize_tables",
]


def __getattr__(name: str) -> Any:
    """A public name imported from its module on first use (then cached here); a submodule
    by its name (``irpe.models``), as an eager package would have it."""
    home = _HOMES.get(name)
    if home is not None:
        value = getattr(importlib.import_module(home, __name__), name)
    else:
        try:
            value = importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(_HOMES))
