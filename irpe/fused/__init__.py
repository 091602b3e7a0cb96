"""Fused iRPE attention: a Triton FlashAttention-style kernel with the iRPE terms inside.

Importing this package does not import Triton; the kernel module is loaded on first launch.
"""
from .dispatch import (
    FusedMode,
    cpu_supported,
    fused_attention,
    fused_mode,
    fused_supported,
    set_fused_attention,
    set_fused_ids,
)
from .launch import interpreter_enabled, kernel_available
from .op import fused_rpe_attention
from .reference import reference_forward

__all__ = ["FusedMode", "cpu_supported", "fused_attention", "fused_mode", "fused_supported",
           "set_fused_attention", "set_fused_ids", "fused_rpe_attention", "interpreter_enabled",
           "kernel_available", "reference_forward"]
