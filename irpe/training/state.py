"""``last.pt``: what a run needs to continue exactly where it stopped, on any world size.

Besides model, optimiser, schedule and scaler it keeps the position (completed epochs, steps
into the unfinished one, the global batch they were counted in), the flip generator (the same
on every rank) and each rank's global torch RNG (drop-path, mixup), gathered to rank 0.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, List, Optional

import torch

from ..checkpoint import CheckpointError, load_torch_file
from .distributed import Dist

__all__ = ["rng_snapshot", "restore_rng", "read_last", "check_fits", "resume_step",
           "canonical_tree", "logged"]


def rng_snapshot(d: Dist, flip: torch.Generator) -> Optional[Dict]:
    """Every rank's RNG states on rank 0 (a collective: all ranks call it)."""
    mine = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        mine["cuda"] = torch.cuda.get_rng_state()
    ranks = d.gather(mine)
    if not d.main or ranks is None:  # (rank 0 gets the list, the others None)
        return None
    return {"flip": flip.get_state(), "torch": [r["torch"] for r in ranks],
            "cuda": [r["cuda"] for r in ranks if "cuda" in r]}


def restore_rng(rng: Optional[Dict], d: Dist, flip: torch.Generator, seed: int,
                epoch: int) -> str:
    """Put back the saved streams; another world size re-seeds the per-rank ones (said)."""
    if not rng:
        return "no RNG state in the file (older run): streams re-seeded"
    flip.set_state(rng["flip"])
    per_rank: List = rng["torch"]
    if len(per_rank) == d.world:
        torch.set_rng_state(per_rank[d.rank])
        cuda = rng.get("cuda") or []
        if len(cuda) == d.world and torch.cuda.is_available():
            torch.cuda.set_rng_state(cuda[d.rank])
        return ""
    torch.manual_seed(seed + d.rank + 1000003 * (epoch + 1))
    return (f"saved by {len(per_rank)} processes, resumed on {d.world}: per-process random "
            "streams (drop-path, mixup) re-seeded; sample order and flips continue exactly")


def read_last(path: str, model_name: str, classes: List[str]) -> Dict:
    """Load ``last.pt`` (weights-only) and check it belongs to this model and class list."""
    if not os.path.isfile(path):
        raise CheckpointError(f"resume file not found: {path}")
    state = load_torch_file(path)  # not a torch.save file: one CheckpointError
    trained = state.get("config", {}).get("model")
    if trained != model_name:
        raise CheckpointError(f"{path} was trained as {trained}, not {model_name}")
    saved = state.get("classes")
    if saved is not None and list(saved) != list(classes):
        raise CheckpointError(
            f"{path} was trained on {len(saved)} classes {_few(saved)}, this dataset has "
            f"{len(classes)} {_few(classes)}: resume needs the same classes (use --init to "
            "fine-tune on other ones)")
    return state


def check_fits(model: torch.nn.Module, state: Dict, path: str) -> None:
    """Load the weights; a shape mismatch (a file without a class list) is a clear error."""
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as exc:
        first = str(exc).splitlines()[-1].strip()
        raise CheckpointError(f"{path} does not fit this model and dataset (another class "
                              f"count?): {first}") from None


def resume_step(state: Dict, global_batch: int, path: str) -> int:
    """Steps already done in the unfinished epoch, counted in this run's global batch."""
    done = int(state.get("epoch_step", 0))
    if not done:
        return 0
    consumed = done * int(state.get("global_batch", global_batch))
    if consumed % global_batch:
        raise CheckpointError(
            f"{path} stopped {consumed} samples into epoch {state['epoch'] + 1}, not a multiple "
            f"of this run's global batch {global_batch}: resume with the global batch "
            f"{state.get('global_batch')} (--batch-size x processes x --grad-accum-steps"
            f"{_saved_split(state)}) or from an epoch boundary")
    return consumed // global_batch


def _saved_split(state: Dict) -> str:
    """", it ran 4 x 1 x 2" from the saved config and process count ("" when not saved)."""
    config = state.get("config") or {}
    if "batch_size" not in config or "processes" not in state:
        return ""
    return (f"; it ran {config['batch_size']} x {state['processes']} x "
            f"{config.get('grad_accum_steps', 1)}")


def canonical_tree(obj: Any) -> Any:
    """``obj`` rebuilt for a byte-stable ``torch.save``: new dicts, lists and tuples, and every
    string interned. Pickle writes a second reference to one object as a back-reference; which
    equal strings were one object differed between a run straight through (an optimiser group's
    parameter names are the model's) and a resumed one (read back from ``last.pt``), and so did
    the bytes of equal states. Interned, equal strings are one object in every run."""
    if isinstance(obj, str):
        return sys.intern(obj)
    if isinstance(obj, dict):
        return {canonical_tree(k): canonical_tree(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [canonical_tree(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(canonical_tree(v) for v in obj)
    return obj


def logged(output: str, epoch: int, step: int) -> bool:
    """Whether ``output``'s log.jsonl ends with the evaluation of completed epoch ``epoch``
    at ``step`` (the trainer logs an epoch after writing its files)."""
    try:
        with open(os.path.join(output, "log.jsonl"), encoding="utf-8") as fh:
            lines = fh.read().splitlines()
        last = json.loads(lines[-1]) if lines else {}
    except (OSError, ValueError):
        return False
    return (isinstance(last, dict) and last.get("epoch") == epoch and last.get("step") == step
            and not last.get("partial"))


def _few(names: List[str]) -> str:
    return str(list(names)) if len(names) <= 6 else f"{list(names)[:6]}..."
