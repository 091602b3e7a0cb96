# Follows the code of microsoft/Cream iRPE (MIT): see NOTICE.
"""iRPE modules: configuration, bias/contextual encodings on queries, keys and values.

Parameter names and shapes equal the official ones (``lookup_table_bias`` (H|1, nb),
``lookup_table_weight`` (H|1, D, nb) on Q/K and (H|1, nb, D) on V; cross has ``rp_rows`` and
``rp_cols``) so official checkpoints load strictly. The computation uses the efficient forms:
contextual Q/K = (x @ W) then bucket gather; V = bucket scatter-add of attn, then @ W.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple, Union

import torch
from torch import nn

from .bucket import IntOrTensor, Method, bucket_ids, bucket_ids_traceable, num_buckets, parse_method
from .idcache import BUCKET_IDS
from .ops import rpe_gather, rpe_scatter

__all__ = ["RPEConfig", "get_rpe_config", "build_rpe", "iRPE", "iRPECross", "Encoding",
           "GridSize", "rpe_parts", "attention_grid", "set_traceable", "randomize_tables"]

_MODES = {"bias": "bias", "contextual": "contextual", "ctx": "contextual"}
# a grid height or width: an int, a traced size (dynamic-resolution export) or None (the
# square grid of the sequence length)
GridSize = Optional[IntOrTensor]


@dataclass(frozen=True)
class RPEConfig:
    """Where and how iRPE is applied; one config describes the Q, K and V encodings (the C++
    ``RPEConfig`` structs of plugins/ hold one exported node's share: method, ratio, skip)."""

    ratio: float = 1.9
    method: Method = Method.PRODUCT
    mode: str = "contextual"
    shared_head: bool = True
    skip: int = 0
    on: str = "k"

    def __post_init__(self) -> None:
        object.__setattr__(self, "method", parse_method(self.method))
        if self.mode not in _MODES:
            raise ValueError(f"unknown iRPE mode {self.mode!r}; expected bias, contextual or ctx")
        object.__setattr__(self, "mode", _MODES[self.mode])
        on = self.on.lower()
        if not on or set(on) - set("qkv") or len(set(on)) != len(on):
            raise ValueError(f"rpe_on must be a non-empty combination of q, k, v; got {self.on!r}")
        object.__setattr__(self, "on", "".join(c for c in "qkv" if c in on))
        if "v" in self.on and self.mode == "bias":
            raise ValueError("iRPE bias mode is not defined on values (use contextual)")
        if self.method in (Method.CROSS_ROWS, Method.CROSS_COLS):
            raise ValueError("use method 'cross'; rows/cols are its internal halves")
        if self.skip < 0 or not self.ratio > 0:
            raise ValueError(f"need skip >= 0 and ratio > 0, got skip={self.skip} "
                             f"ratio={self.ratio}")

    @property
    def num_buckets(self) -> int:
        """Buckets allocated per table (per direction for cross), extra skip bucket included."""
        return num_buckets(self.method, self.ratio, self.skip)

    @property
    def rpe_q(self) -> Optional["RPEConfig"]:
        return self if "q" in self.on else None

    @property
    def rpe_k(self) -> Optional["RPEConfig"]:
        return self if "k" in self.on else None

    @property
    def rpe_v(self) -> Optional["RPEConfig"]:
        return self if "v" in self.on else None

    def to_string(self) -> str:
        """DETR-style config string ``rpe-{ratio}-{method}-{mode}-{shared}-{on}``."""
        mode = "ctx" if self.mode == "contextual" else "bias"
        return f"rpe-{self.ratio}-{self.method.value}-{mode}-{int(self.shared_head)}-{self.on}"

    @classmethod
    def from_string(cls, text: str, skip: int = 0) -> "RPEConfig":
        """Parse ``rpe-2.0-product-ctx-1-k`` (the official DETR option format)."""
        parts = text.split("-")
        if len(parts) != 6 or parts[0] != "rpe":
            raise ValueError(f"bad iRPE config string {text!r}; expected "
                             "rpe-{ratio}-{method}-{mode}-{shared}-{on}")
        try:
            ratio = float(parts[1])
        except ValueError:
            raise ValueError(f"bad ratio {parts[1]!r} in {text!r}") from None
        if parts[4] not in ("0", "1"):
            raise ValueError(f"shared_head must be 0 or 1 in {text!r}")
        return cls(ratio, parse_method(parts[2]), parts[3], parts[4] == "1", skip, parts[5])

    def to_dict(self) -> dict:
        """JSON form: the config string and skip (what rebuilds it) plus the derived fields a
        reader may want (ratio, method, mode, shared_head, on, num_buckets)."""
        return {"config": self.to_string(), "ratio": self.ratio, "method": self.method.value,
                "mode": self.mode, "shared_head": self.shared_head, "skip": self.skip,
                "on": self.on, "num_buckets": self.num_buckets}

    @classmethod
    def from_dict(cls, data: dict) -> "RPEConfig":
        """Inverse of :meth:`to_dict`; also reads the older ``{"rpe", "skip"}`` form."""
        text = data.get("config", data.get("rpe"))
        if not isinstance(text, str):
            raise ValueError(f"not an iRPE config dict: {data!r}")
        return cls.from_string(text, skip=int(data.get("skip", 0)))


def get_rpe_config(ratio: float = 1.9, method: Union[str, int, Method] = "product",
                   mode: str = "contextual", shared_head: bool = True, skip: int = 0,
                   rpe_on: str = "k") -> RPEConfig:
    """Build an :class:`RPEConfig` from the official keyword arguments and aliases."""
    return RPEConfig(ratio=ratio, method=parse_method(method), mode=mode,
                     shared_head=shared_head, skip=skip, on=rpe_on)


class iRPE(nn.Module):
    """One image relative position encoding (all methods except cross).

    ``transposed`` is True on queries/keys (output (B,H,Lq,Lk) added to the logits) and False on
    values (input attn (B,H,Lq,Lk), output (B,H,Lq,D) added to attn @ v).
    """

    def __init__(self, head_dim: int, num_heads: int, mode: str, method: Method, ratio: float,
                 skip: int, transposed: bool = True,
                 initializer: Optional[Callable[[torch.Tensor], None]] = None) -> None:
        super().__init__()
        self.head_dim, self.num_heads, self.mode = head_dim, num_heads, _MODES[mode]
        self.method, self.ratio, self.skip = parse_method(method), ratio, skip
        self.transposed = transposed
        self.num_buckets = num_buckets(self.method, ratio, skip)
        self.traceable = False  # True: compute ids in-graph (dynamic-resolution export)
        self.fixed_grid = False  # exporting one static grid size: see forward_transposed
        if self.mode == "bias":
            if not transposed:
                raise ValueError("iRPE bias mode is not defined on values")
            self.lookup_table_bias = nn.Parameter(torch.zeros(num_heads, self.num_buckets))
        else:
            shape = ((num_heads, head_dim, self.num_buckets) if transposed
                     else (num_heads, self.num_buckets, head_dim))
            self.lookup_table_weight = nn.Parameter(torch.zeros(shape))
        if initializer is not None:
            for p in self.parameters():
                initializer(p)

    def grid(self, length: int, height: Optional[int] = None, width: Optional[int] = None
             ) -> Tuple[int, int, int]:
        """(height, width, skip) for a sequence; without H/W the grid is floor(sqrt(L)) square."""
        if height is None or width is None:
            _both_or_neither(height, width)
            height = width = int(math.isqrt(length))
        skip = length - height * width
        if skip < 0:
            raise ValueError(f"sequence of {length} tokens is shorter than the {height}x{width} "
                             "grid")
        return height, width, skip

    def check_grid(self, length: int, height: Optional[int] = None,
                   width: Optional[int] = None) -> Tuple[int, int, int]:
        """:meth:`grid` checked against this module: ValueError when the sequence has skip
        tokens and the module was built without (or the reverse), as :meth:`forward` raises."""
        height, width, skip = self.grid(length, height, width)
        return height, width, self._skip(skip)

    @property
    def parts(self) -> List["iRPE"]:
        """The single-table encodings this module is made of: itself (cross: rows, cols)."""
        return [self]

    def bucket_ids(self, length: int, height: GridSize = None, width: GridSize = None,
                   device: Optional[torch.device] = None) -> torch.Tensor:
        """Bucket ids (L, L) for this module's method; cached unless tracing dynamic sizes."""
        # height and width come together (grid() says so otherwise); an int height has an int width
        if self.fixed_grid:  # exporting one static size: the ids become a graph constant
            length = int(length)
            height = None if height is None else int(height)
            width = None if width is None else int(width)
        elif (self.traceable or isinstance(height, torch.Tensor) or isinstance(width, torch.Tensor)
              or torch.compiler.is_compiling()):
            # torch.compile: ids in-graph (the locked id cache would break the graph)
            if height is None or width is None:
                _both_or_neither(height, width)
                height, width, _ = self.grid(length)
            if isinstance(height, torch.Tensor) or isinstance(width, torch.Tensor):
                skip = self.skip  # traced sizes: the module's skip
            else:
                skip = self._skip(length - height * width)
            return bucket_ids_traceable(self.method, self.ratio, height, width, skip,
                                        device=device)
        height, width, skip = self.check_grid(length, height, width)
        device = None if device is None else torch.device(device)
        if device is None or device.type == "cpu":  # CPU ids: cached by bucket_ids
            return bucket_ids(self.method, self.ratio, height, width, skip)
        # other devices: one lookup per forward; the CPU ids are read only on a miss
        key = (self.method, float(self.ratio), height, width, skip, device)
        return BUCKET_IDS.get_or_build(key, lambda: _to_device(
            bucket_ids(self.method, self.ratio, height, width, skip), device))  # one LRU by bytes

    def _skip(self, skip: int) -> int:
        if isinstance(skip, int) and (skip > 0) != (self.skip > 0):
            raise ValueError(f"input has {skip} skip tokens but the module was built with "
                             f"skip={self.skip} ({self.num_buckets} buckets)")
        return skip

    def forward(self, x: torch.Tensor, height: GridSize = None, width: GridSize = None
                ) -> torch.Tensor:
        """Encoding for x (B,H,L,D) on Q/K -> (B|1,H,L,L); for attn (B,H,L,L) on V -> (B,H,L,D)."""
        ids = self.bucket_ids(x.shape[2], height, width, device=x.device)
        if not self.transposed:
            buckets = rpe_scatter(x, ids, self.num_buckets)  # (B, H, Lq, nb)
            return torch.matmul(buckets, self.lookup_table_weight.unsqueeze(0).to(x.dtype))
        if self.mode == "bias":
            lq, lk = ids.shape
            return self.lookup_table_bias[:, ids.reshape(-1)].view(1, -1, lq, lk).to(x.dtype)
        return rpe_gather(self.table(x), ids)

    def table(self, x: torch.Tensor) -> torch.Tensor:
        """Per-token lookup table of x (B,H,L,D) on Q/K: contextual x @ W -> (B,H|1,L,K); bias:
        the (H|1, K) table broadcast to (1,H|1,L,K). Entry [.., i, c] is bucket c's value for
        token i, which the bucket ids gather from."""
        if self.mode == "bias":
            bias = self.lookup_table_bias.to(x.dtype)
            return bias.view(1, bias.shape[0], 1, -1).expand(1, -1, x.shape[2], -1)
        return torch.matmul(x, self.lookup_table_weight.unsqueeze(0).to(x.dtype))

    def forward_transposed(self, x: torch.Tensor, height: GridSize = None,
                           width: GridSize = None) -> torch.Tensor:
        """``forward(x).transpose(2, 3)`` for Q/K (the iRPE-Q logits term), layout-free on export.

        When exporting one static grid size (``set_traceable(m, fixed_grid=True)``), the table
        is flattened to ONE row (B,H,1,L*K) and gathered with index [i,j] = j*K + id(j,i): the
        output comes out transposed, so the graph holds no attention-sized Transpose for the Q
        term. (L*K must be static for the exported node, hence not for dynamic sizes.)
        """
        if not (self.fixed_grid and self.mode == "contextual" and self.transposed):
            return self(x, height, width).transpose(2, 3)
        heads, length = int(x.shape[1]), int(x.shape[2])  # static: constants in the graph
        ids = self.bucket_ids(length, height, width, device=x.device)
        table = self.table(x)
        rows = torch.arange(length, device=x.device).unsqueeze(1) * self.num_buckets
        flat = (ids.to(torch.long) + rows).transpose(0, 1)
        return rpe_gather(table.reshape(-1, heads, 1, length * self.num_buckets), flat)

    def extra_repr(self) -> str:
        return (f"head_dim={self.head_dim}, num_heads={self.num_heads}, mode={self.mode}, "
                f"method={self.method.value}, ratio={self.ratio}, transposed={self.transposed}, "
                f"num_buckets={self.num_buckets}")


class iRPECross(nn.Module):
    """Cross method: independent row and column encodings whose outputs are summed."""

    def __init__(self, **kwargs) -> None:
        super().__init__()
        kwargs.pop("method", None)
        self.rp_rows = iRPE(method=Method.CROSS_ROWS, **kwargs)
        self.rp_cols = iRPE(method=Method.CROSS_COLS, **kwargs)

    @property
    def num_buckets(self) -> int:
        return self.rp_rows.num_buckets

    @property
    def parts(self) -> List[iRPE]:
        """The two single-table encodings: rows, then columns."""
        return [self.rp_rows, self.rp_cols]

    def check_grid(self, length: int, height: Optional[int] = None,
                   width: Optional[int] = None) -> Tuple[int, int, int]:
        """:meth:`iRPE.check_grid` (both halves share grid and skip)."""
        return self.rp_rows.check_grid(length, height, width)

    def forward(self, x: torch.Tensor, height: GridSize = None, width: GridSize = None
                ) -> torch.Tensor:
        return self.rp_rows(x, height, width) + self.rp_cols(x, height, width)

    def forward_transposed(self, x: torch.Tensor, height: GridSize = None,
                           width: GridSize = None) -> torch.Tensor:
        """``forward(x).transpose(2, 3)``, see :meth:`iRPE.forward_transposed`."""
        return (self.rp_rows.forward_transposed(x, height, width)
                + self.rp_cols.forward_transposed(x, height, width))


Encoding = Union[iRPE, iRPECross]  # one of build_rpe's modules


def _both_or_neither(height: GridSize, width: GridSize) -> None:
    if (height is None) != (width is None):
        raise ValueError("give both height and width, or neither")


def rpe_parts(*modules: Optional[Encoding]) -> List[iRPE]:
    """The single-table encodings of ``modules`` in order (cross: rows, cols; None: none)."""
    return [part for m in modules if m is not None for part in m.parts]


def attention_grid(rpe_q: Optional[Encoding], rpe_k: Optional[Encoding],
                   rpe_v: Optional[Encoding], length: int, height: Optional[int] = None,
                   width: Optional[int] = None) -> Tuple[int, int, int]:
    """(height, width, skip) of an attention call with these encodings (at least one given),
    checked by the first one the unfused path evaluates (K, then Q, then V), so every path
    raises the same error before any work."""
    first = next(m for m in (rpe_k, rpe_q, rpe_v) if m is not None)
    return first.check_grid(length, height, width)


@torch.inference_mode(False)  # cached ids must stay usable by autograd
def _to_device(ids: torch.Tensor, device: torch.device) -> torch.Tensor:
    return ids.to(device)


def build_rpe(config: Optional[RPEConfig], head_dim: int, num_heads: int,
              initializer: Optional[Callable[[torch.Tensor], None]] = None
              ) -> Tuple[Optional[Encoding], Optional[Encoding], Optional[Encoding]]:
    """Build (rpe_q, rpe_k, rpe_v) modules for a config; absent encodings are None."""
    if config is None:
        return None, None, None

    def one(on: str, transposed: bool) -> Optional[Encoding]:
        if on not in config.on:
            return None
        cls: type[Encoding] = iRPECross if config.method == Method.CROSS else iRPE
        return cls(head_dim=head_dim, num_heads=1 if config.shared_head else num_heads,
                   mode=config.mode, method=config.method, ratio=config.ratio, skip=config.skip,
                   transposed=transposed, initializer=initializer)

    return one("q", True), one("k", True), one("v", False)


def set_traceable(module: nn.Module, traceable: bool = True, fixed_grid: bool = False
                  ) -> nn.Module:
    """Switch every iRPE submodule to in-graph id computation (for export).

    ``fixed_grid``: the export has one static grid size (DeiT), which allows the transposed
    iRPE-Q gather (:meth:`iRPE.forward_transposed`); detection exports keep it False.
    """
    for m in module.modules():
        if isinstance(m, iRPE):
            m.traceable, m.fixed_grid = traceable, traceable and fixed_grid
    return module


def randomize_tables(module: nn.Module, std: float = 0.02) -> nn.Module:
    """Fill every iRPE lookup table under ``module`` with N(0, std), in place (torch's RNG).

    DeiT tables start at zero, so an untrained model's iRPE terms vanish; benchmarks, the
    self-check and parity tests randomise them so the iRPE code paths carry real values.
    """
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, iRPE):
                for table in m.parameters(recurse=False):
                    table.normal_(0, std)
    return module
