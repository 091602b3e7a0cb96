# Follows the code of microsoft/Cream iRPE (MIT): see NOTICE.
"""Independent references used only by tests: scalar piecewise math and naive O(L^2 d) iRPE."""
import math

import torch


def piecewise_scalar(x: float, ratio: float) -> int:
    """Eq. 18 on one number in double precision (official order of clip/round/trunc)."""
    alpha, beta, gamma = ratio, 2 * ratio, 8 * ratio
    if abs(x) <= alpha:
        return int(round(x))  # Python round is half-to-even like torch.round
    y = alpha + math.log(abs(x) / alpha) / math.log(gamma / alpha) * (beta - alpha)
    return int(math.copysign(min(beta, round(y)), x))


def bucket_scalar(method: str, ratio: float, dr: int, dc: int) -> int:
    """One bucket id from a (row, col) offset, per method, without skip handling."""
    b = int(2 * ratio)
    if method == "product":
        return (piecewise_scalar(dr, ratio) + b) * (2 * b + 1) + piecewise_scalar(dc, ratio) + b
    if method == "euc":
        return piecewise_scalar(round(math.sqrt(dr * dr + dc * dc)), ratio) + b
    if method == "quant":
        return piecewise_scalar(dr * dr + dc * dc, ratio) + b
    if method == "cross_rows":
        return piecewise_scalar(dr, ratio) + b
    if method == "cross_cols":
        return piecewise_scalar(dc, ratio) + b
    raise ValueError(method)


def bucket_table(method: str, ratio: float, h: int, w: int, skip: int, extra: int):
    """Full (skip+L)^2 id table built with Python loops."""
    pos = [(r, c) for r in range(h) for c in range(w)]
    n = skip + len(pos)
    table = [[extra] * n for _ in range(n)]
    for i, (ri, ci) in enumerate(pos):
        for j, (rj, cj) in enumerate(pos):
            table[skip + i][skip + j] = bucket_scalar(method, ratio, ri - rj, ci - cj)
    return torch.tensor(table)


def naive_rpe(module, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Materialise r_ij for every pair (the official O(L^2 d) way) and apply it."""
    if module.mode == "bias":
        return module.lookup_table_bias[:, ids].unsqueeze(0)  # (1, H, L, L)
    w = module.lookup_table_weight
    if module.transposed:  # w (H, D, nb) -> r (H, L, L, D); out[b,h,i,j] = x[b,h,i] . r[h,i,j]
        r = w[:, :, ids].permute(0, 2, 3, 1)
        return torch.einsum("bhid,hijd->bhij", x, r)
    r = w[:, ids, :]  # (H, L, L, D); out[b,h,i] = sum_j attn[b,h,i,j] r[h,i,j]
    return torch.einsum("bhij,hijd->bhid", x, r)
