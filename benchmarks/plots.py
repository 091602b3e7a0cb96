"""PNG plots of `irpe bench` reports (matplotlib, Agg backend): one figure per question."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from benchmarks.fits import fit_rows, fits, series_key  # noqa: E402


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _ok(results: List[Dict]) -> List[Dict]:
    return [r for r in results if "error" not in r]


def _series(rows: List[Dict], key: Callable[[Dict], str], x: str, y: str
            ) -> Dict[str, List[Tuple[float, float]]]:
    out: Dict[str, List[Tuple[float, float]]] = defaultdict(list)
    for r in rows:
        if r.get(y) is not None:
            out[key(r)].append((r[x], r[y]))
    return {k: sorted(v) for k, v in out.items()}


def _lines(ax, series: Dict[str, List[Tuple[float, float]]], logx: bool = False) -> None:
    for label, pts in series.items():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    if logx:
        ax.set_xscale("log", base=2)
    ax.grid(alpha=0.3)
    if series:
        ax.legend(fontsize=6)


def _label(r: Dict) -> str:
    return f"{r['family']} {r['variant']} {r['backend']} {r['precision']} {r['size']}"


def _png(stem: Path, suffix: str) -> Path:
    return stem.with_name(stem.name + suffix + ".png")


def models_plots(doc: Dict, stem: Path) -> List[Path]:
    """Throughput vs batch per backend; latency percentiles and memory per config."""
    rows = _ok(doc["results"])
    fig, ax = plt.subplots(figsize=(8, 5))
    _lines(ax, _series(rows, _label, "batch", "images_per_s"), logx=True)
    ax.set(xlabel="batch", ylabel="images / s", title=f"throughput vs batch ({doc['device']})")
    paths = [_save(fig, _png(stem, "_throughput"))]
    paths.append(_bars(rows, ("p50_ms", "p90_ms", "p99_ms"), "latency per batch (ms)",
                       _png(stem, "_latency")))
    paths.append(_bars(rows, ("rss_delta_mb", "peak_mb"), "memory (MB)", _png(stem, "_memory")))
    return paths


def _bars(rows: List[Dict], keys, ylabel: str, path: Path) -> Path:
    """Grouped bars: one group per config, one bar per key."""
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(rows) + 2), 5))
    width = 0.8 / len(keys)
    for i, key in enumerate(keys):
        values = [r.get(key) or 0 for r in rows]
        ax.bar([j + i * width for j in range(len(rows))], values, width, label=key)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))])
    ax.set_xticklabels([f"{_label(r)} b{r['batch']}" for r in rows], rotation=75, fontsize=6)
    ax.set(ylabel=ylabel)
    ax.legend(fontsize=7)
    return _save(fig, path)


def ops_series(doc: Dict) -> Dict[str, List[Tuple[float, float]]]:
    """(L, ms) per op, labelled with the op's fitted exponent."""
    slopes = {f["op"]: f["slope"] for f in doc.get("fits") or fits(doc["results"])}

    def key(r: Dict) -> str:
        p = slopes.get(series_key(r))
        return series_key(r) + ("" if p is None else f" (fitted p={p:.2f})")
    return _series(fit_rows(doc["results"]), key, "L", "median_ms")


def ops_plots(doc: Dict, stem: Path) -> List[Path]:
    """Op cost vs sequence length L, log-log; the legend gives each op's fitted exponent."""
    fig, ax = plt.subplots(figsize=(7, 5))
    _lines(ax, ops_series(doc))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set(xlabel="sequence length L", ylabel="ms per call", title="iRPE op cost vs L")
    return [_save(fig, _png(stem, "_cost_vs_L"))]


def serve_plots(doc: Dict, stem: Path) -> List[Path]:
    """Per model: closed-loop throughput and latency vs clients; the server's batch sizes."""
    models = list(dict.fromkeys(r.get("model", "-") for r in doc["results"]))
    hists = doc.get("batch_histogram", {})
    fig, axes = plt.subplots(len(models), 3, figsize=(13, 4 * len(models)), squeeze=False)
    for (a, b, c), model in zip(axes, models, strict=True):
        rows = [r for r in doc["results"] if r.get("model", "-") == model]
        closed = [r for r in rows if r["mode"] == "closed"]
        _lines(a, _series(closed, lambda r: "HTTP", "load", "images_per_s"))
        for mode, style in (("in-process", "--"), ("backend", ":")):
            for r in (r for r in rows if r["mode"] == mode):
                a.axhline(r["images_per_s"], color="gray", ls=style, label=mode)
        a.legend(fontsize=7)
        a.set(xlabel="clients", ylabel="images / s", title=f"{model}: throughput")
        _lines(b, {f"p{q}": [(r["load"], r[f"p{q}_ms"]) for r in closed] for q in (50, 90, 99)})
        b.set(xlabel="clients", ylabel="ms", title=f"{model}: latency")
        hist = hists.get(model, hists if model == "-" else {})  # "-": older one-model reports
        c.bar([str(k) for k in hist], list(hist.values()))
        c.set(xlabel="batch size (upper bound)", ylabel="batches", title=f"{model}: batches")
    return [_save(fig, _png(stem, ""))]


PLOTS: Dict[str, Callable[[Dict, Path], List[Path]]] = {
    "models": models_plots, "ops": ops_plots, "serve": serve_plots}
