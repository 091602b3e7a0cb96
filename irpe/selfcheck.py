"""Steps of ``irpe check``: each returns a short detail string or raises on failure."""
from __future__ import annotations

import os
import tempfile
import time
from typing import Callable, Dict, List, Optional, Tuple, TypedDict, cast

import torch

from .bucket import bucket_ids, bucket_ids_traceable, num_buckets
from .checkpoint import save_checkpoint
from .models import create_model
from .ops import rpe_gather, rpe_scatter
from .rpe import randomize_tables

_METHODS = (("product", 1.9), ("euc", 20), ("quant", 33), ("cross_rows", 20), ("cross_cols", 20))
_GRIDS = ((14, 14, 1), (7, 11, 0), (5, 3, 2), (1, 9, 1))


def check_ids() -> str:
    for method, ratio in _METHODS:
        for h, w, skip in _GRIDS:
            if not torch.equal(bucket_ids(method, ratio, h, w, skip),
                               bucket_ids_traceable(method, ratio, h, w, skip)):
                raise AssertionError(f"{method} ratio {ratio} grid {h}x{w} skip {skip} differ")
    counts = [num_buckets(m, r, 1) for m, r in _METHODS[:4]]
    if counts != [50, 82, 134, 82]:
        raise AssertionError(f"bucket counts {counts} != [50, 82, 134, 82]")
    return f"{len(_METHODS)} methods x {len(_GRIDS)} grids equal; buckets {counts}"


def check_ops() -> str:
    g = torch.Generator().manual_seed(0)
    table = torch.randn(2, 3, 5, 4, dtype=torch.float64, generator=g, requires_grad=True)
    attn = torch.randn(2, 3, 5, 6, dtype=torch.float64, generator=g, requires_grad=True)
    index = torch.randint(0, 4, (5, 6), generator=g, dtype=torch.int32)
    torch.autograd.gradcheck(lambda t: rpe_gather(t, index), (table,))
    torch.autograd.gradcheck(lambda a: rpe_scatter(a, index, 4), (attn,))
    lhs = (rpe_gather(table, index) * attn).sum()
    rhs = (table * rpe_scatter(attn, index, 4)).sum()
    torch.testing.assert_close(lhs, rhs)
    return "gradcheck gather+scatter, adjoint identity"


def _outputs(model: torch.nn.Module, x: torch.Tensor, sizes: Optional[torch.Tensor] = None
             ) -> Dict[str, torch.Tensor]:
    """Named outputs of a classifier (logits) or a DETR detector (pred_logits, pred_boxes)."""
    out = model(x) if sizes is None else model(x, sizes)
    if isinstance(out, dict):
        return {k: out[k] for k in ("pred_logits", "pred_boxes")}
    return {"logits": out}


def _check_outputs(model: torch.nn.Module, out: Dict[str, torch.Tensor], batch: int) -> None:
    """Shapes, finiteness and (detection) boxes in 0..1 of the task's outputs."""
    classes = cast(int, model.num_classes)  # set by every registered builder (nn.Module: untyped)
    expected: Dict[str, Tuple[int, ...]]
    if "logits" in out:
        expected = {"logits": (batch, classes)}
    else:
        queries = out["pred_logits"].shape[1]
        expected = {"pred_logits": (batch, queries, classes + 1), "pred_boxes": (batch, queries, 4)}
    for name, shape in expected.items():
        if tuple(out[name].shape) != shape or not torch.isfinite(out[name]).all():
            raise AssertionError(f"bad output {name} {tuple(out[name].shape)}, expected {shape}")
    boxes = out.get("pred_boxes")
    if boxes is not None and not ((boxes >= 0) & (boxes <= 1)).all():
        raise AssertionError("pred_boxes outside 0..1")


def _shapes(out: Dict[str, torch.Tensor]) -> str:
    return ", ".join(f"{k} {tuple(v.shape)}" for k, v in out.items())


class _State(TypedDict, total=False):
    """What the steps hand on: the built model, the forward step's input and outputs."""
    model: torch.nn.Module
    x: torch.Tensor
    y: Dict[str, torch.Tensor]


def steps(model_name: str, batch: int, img_size: int) -> List[Tuple[str, Callable[[], str]]]:
    """The ordered self-check steps; later steps reuse the model built by an earlier one.
    Classifiers and DETR detectors alike (the outputs checked are the task's)."""
    state: _State = {}

    def build() -> str:
        model = create_model(model_name).eval()
        randomize_tables(model)  # so the iRPE terms are not zero
        state["model"] = model
        return f"{model_name}, {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params"

    def forward() -> str:
        model = state["model"]
        x = torch.randn(batch, 3, img_size, img_size)
        with torch.inference_mode():
            _outputs(model, x)  # warm-up (bucket ids are cached on first use)
            t0 = time.perf_counter()
            y = _outputs(model, x)
            ms = (time.perf_counter() - t0) * 1000
        _check_outputs(model, y, batch)
        state["x"], state["y"] = x, y
        return f"bs {batch} {img_size}x{img_size} -> {_shapes(y)}, {ms / batch:.1f} ms/image"

    def round_trip() -> str:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "model.safetensors")
            save_checkpoint(state["model"], path)
            reloaded = create_model(model_name, checkpoint=path).eval()
            size = os.path.getsize(path)
        with torch.inference_mode():
            again = _outputs(reloaded, state["x"])
        diff = max((again[k] - v).abs().max().item() for k, v in state["y"].items())
        if diff != 0:
            raise AssertionError(f"reloaded model differs by {diff}")
        return f"safetensors {size / 1e6:.1f} MB, strict load, outputs identical"

    def non_square() -> str:
        model = state["model"]
        x = torch.randn(1, 3, img_size * 5 // 7 // 16 * 16 or 16, img_size)
        detail, sizes = f"input {x.shape[2]}x{x.shape[3]}", None
        if "logits" in state["y"]:
            detail += f" (grid {x.shape[2] // 16}x{x.shape[3] // 16})"
        else:  # detection: a padded pair, the second image smaller (key padding mask)
            x = torch.cat([x, x])
            sizes = torch.tensor([list(x.shape[2:]), [x.shape[2] // 2, x.shape[3]]])
            detail += f", padded pair with sizes {sizes.tolist()}"
        with torch.inference_mode():
            _check_outputs(model, _outputs(model, x, sizes), x.shape[0])
        return detail + " ok"

    return [("bucket ids: cached == traceable", check_ids), ("ops: gradcheck, adjoint", check_ops),
            ("build model", build), ("forward", forward), ("checkpoint round trip", round_trip),
            ("non-square input", non_square)]
