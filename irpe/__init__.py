"""irpe: image relative position encoding (Wu et al., ICCV 2021) for deployment.

The iRPE math (bucket ids, encodings, custom ops) lives here once; export/, serve/, plugins/
and benchmarks/ import it.
"""
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

__version__ = "0.1.0"

__all__ = [
    "Method", "bucket_ids", "bucket_ids_traceable", "num_buckets", "piecewise_index",
    "CheckpointError", "load_checkpoint", "read_state_dict", "save_checkpoint",
    "create_model", "list_models", "model_info", "rpe_gather", "rpe_scatter",
    "RPEConfig", "build_rpe", "get_rpe_config", "iRPE", "iRPECross", "set_traceable",
    "randomize_tables",
]
