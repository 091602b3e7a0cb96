"""Safe checkpoint loading: safetensors, or torch.load(weights_only=True) - never arbitrary pickle.

Accepted layouts: ``{'model': state_dict}`` (official DeiT / iRPE zoo), ``{'state_dict': ...}``,
or a bare state_dict. Training checkpoints that also carry an ``argparse.Namespace`` of arguments
(the DeiT training script writes one) load too: Namespace is allow-listed as plain data.
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
from typing import Any, Dict

import torch
from torch import nn

from .errors import IrpeError

__all__ = ["CheckpointError", "read_state_dict", "load_torch_file", "load_checkpoint",
           "save_checkpoint", "canonical_safetensors"]


class CheckpointError(IrpeError, RuntimeError):
    """A checkpoint that is missing, unsafe, or does not fit the model (a user error: one line
    from the CLI)."""


def _unwrap(obj: Any) -> Dict[str, torch.Tensor]:
    for key in ("model", "state_dict", "model_state"):
        if isinstance(obj, dict) and key in obj and isinstance(obj[key], dict):
            obj = obj[key]
            break
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointError("checkpoint holds no state_dict (expected {'model': state_dict}, "
                              "{'state_dict': ...} or a dict of tensors)")
    return obj


def read_state_dict(path: str) -> Dict[str, torch.Tensor]:
    """Read a state_dict from .safetensors or a .pth/.pt file, refusing pickled code."""
    if not os.path.isfile(path):
        raise CheckpointError(f"checkpoint not found: {path}")
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file
        try:
            return load_file(path, device="cpu")
        except Exception as exc:  # safetensors raises its own error types
            raise CheckpointError(f"cannot read safetensors file {path}: {exc}") from exc
    return _unwrap(load_torch_file(path))


def load_torch_file(path: str) -> Any:
    """``torch.load(weights_only=True)`` of an existing file; anything that is not a clean
    torch.save file (text, truncated, pickled code) is one CheckpointError naming the file."""
    with open(path, "rb") as f:
        head = f.read(16)
    if not (head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"):  # zip archive / pickle
        raise CheckpointError(f"{path} is not a checkpoint: neither a torch.save file nor "
                              f".safetensors (it starts with {head!r})")
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"refusing to load {path}: it contains Python objects or code that "
                              f"a weights-only load does not allow ({first}). Convert it to "
                              "safetensors in a trusted environment.") from exc
    except (RuntimeError, EOFError, OSError, KeyError, ValueError) as exc:  # KeyError: a
        raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from exc  # bad magic
    return obj


def load_checkpoint(model: nn.Module, path: str, strict: bool = True) -> nn.Module:
    """Load weights into ``model``; shape or key mismatches raise CheckpointError naming them."""
    state = read_state_dict(path)
    own = model.state_dict()
    bad = [f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(own[k].shape)}"
           for k, v in state.items() if k in own and own[k].shape != v.shape]
    if bad:
        raise CheckpointError("shape mismatch: " + "; ".join(bad[:5]))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if strict and (missing or unexpected):
        raise CheckpointError(f"key mismatch loading {path}: missing {missing[:5]}"
                              f"{'...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}"
                              f"{'...' if len(unexpected) > 5 else ''}")
    return model


def save_checkpoint(model: nn.Module, path: str, metadata: Dict[str, str] | None = None) -> None:
    """Write the model's state_dict as safetensors (the format this project ships); equal
    weights and metadata give equal bytes (:func:`canonical_safetensors`)."""
    from safetensors.torch import save
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    from irpe.atomic import write_bytes
    data = save(state, metadata=metadata)  # bytes: save_file creates its file mode 0600
    write_bytes(path, canonical_safetensors(data))  # an ordinary file (umask), complete or
    # absent (irpe.atomic)


def canonical_safetensors(data: bytes) -> bytes:
    """``data`` (a safetensors file) with its metadata keys sorted. safetensors writes them in
    the order of a Rust HashMap, which changes from one process to the next, so two saves of
    the same model differed in their header; the tensors and their offsets are untouched (the
    offsets count from the end of the header). The header is padded with spaces to a multiple
    of 8 bytes, as safetensors pads it."""
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + size])
    meta = header.pop("__metadata__", None)
    ordered = ({"__metadata__": dict(sorted(meta.items()))} if meta else {}) | header
    text = json.dumps(ordered, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + data[8 + size:]
