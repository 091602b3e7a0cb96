"""PNG figures of `irpe bench` reports (matplotlib, Agg backend): one figure per question.

models (``<stem>`` = the report's path without .json):

- ``<stem>_irpe_cost.png``: iRPE cost. Per model and backend, each iRPE variant's throughput as a
  ratio to the plain model's (same backend, batch and run); 1.0 = no cost.
- ``<stem>_throughput.png``: images/s vs batch, a panel per backend, one colour per model and one
  line style per variant; a report with one batch size gets grouped bars instead.
- ``<stem>_latency.png``: p50 / p90 / p99 of one batch forward per model, backend and variant.
- ``<stem>_memory.png``: memory growth (build + first forward) of each iRPE variant as a ratio to
  the plain model's.

ops: ``<stem>_cost_vs_L.png`` (op time vs sequence length, log-log, fitted exponents in the
legend); serve: ``<stem>.png`` (throughput, latency and server batch sizes vs clients per model).

Every figure: the legend outside the axes, colour-blind-safe colours (Okabe-Ito, then Tol
"muted") with no colour repeated within a figure, units on the axes, the device and the date of
the run in the title. `python -m benchmarks.plots bench_*.json ...` redraws the PNGs of saved
reports (only the PNGs; `irpe bench report` rewrites the Markdown as well).
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
import textwrap
from collections import defaultdict
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator  # noqa: E402

from benchmarks.fits import fit_rows, fits, series_key  # noqa: E402

# Okabe & Ito (2008), then Paul Tol's "muted": both readable with the common colour-vision
# deficiencies; yellow last (weak on white)
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000",
           "#332288", "#117733", "#882255", "#44AA99", "#999933", "#AA4499", "#DDCC77",
           "#F0E442")
PLAIN_COLOUR = "#000000"
# variant -> (line style, marker) in the throughput-vs-batch panels
STYLES = (("-", "o"), ("--", "s"), ("-.", "^"), (":", "D"), ((0, (5, 1, 1, 1, 1, 1)), "v"),
          ((0, (1, 3)), "P"), ((0, (8, 3)), "X"))
VARIANT_ORDER = ("plain", "irpe_k", "irpe_q", "irpe_v", "irpe_qk", "irpe_kv", "irpe_qkv")
# Results folders named before the vector unit was part of the name (benchmarks.common):
# docs/benchmarks.md, "the AVX-512 machine of the earlier runs"
LEGACY_ISA = {"cpu-2c-amd-epyc": "AVX-512"}
MEMORY_MIN_MB = 10.0  # a plain model's memory growth below this gives no meaningful ratio
DPI = 110


def colours(n: int) -> List[str]:
    """``n`` distinct colours of PALETTE (ValueError beyond its length: no colour repeats)."""
    if n > len(PALETTE):
        raise ValueError(f"{n} series in one figure: at most {len(PALETTE)} distinct colours")
    return list(PALETTE[:n])


def device_title(slug: str) -> str:
    """A results-folder name in words: cpu-2c-amd-epyc-avx512 -> '2-core AMD EPYC, AVX-512'."""
    if slug.startswith("gpu-"):
        return " ".join(_word(w) for w in slug[4:].split("-"))
    m = re.fullmatch(r"cpu-(\d+)c-(.*?)(?:-(avx512|avx2))?", slug)
    if not m:
        return slug
    name = re.sub(r" \((R|TM)\)", r"(\1)", " ".join(_word(w) for w in m.group(2).split("-")))
    isa = {"avx512": "AVX-512", "avx2": "AVX2"}.get(m.group(3) or "", LEGACY_ISA.get(slug))
    return f"{m.group(1)}-core {name}" + (f", {isa}" if isa else "")


def _word(w: str) -> str:
    known = {"amd": "AMD", "epyc": "EPYC", "nvidia": "NVIDIA", "r": "(R)", "tm": "(TM)",
             "cpu": "CPU", "gpu": "GPU", "hbm3": "HBM3", "pcie": "PCIe", "sxm": "SXM"}
    return known.get(w, w.upper() if any(c.isdigit() for c in w) else w.capitalize())


def _run_line(doc: Dict, extra: Sequence[str] = ()) -> str:
    """'2-core AMD EPYC, AVX-512 · 2026-11-22 19:17 · 1 thread · ...' of a report."""
    threads = doc.get("settings", {}).get("threads", doc.get("torch_threads"))
    parts = [device_title(doc.get("device", "?")), str(doc.get("date", "?"))]
    if threads:
        parts.append(f"{threads} thread{'s' if threads != 1 else ''}")
    return "  ·  ".join(parts + list(extra) + [f"git {doc.get('git_sha', '?')}"])


def _title(fig: Figure, question: str, doc: Dict, extra: Sequence[str] = ()) -> None:
    fig.suptitle(f"{question}\n{_run_line(doc, extra)}", fontsize=11)


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=DPI, bbox_inches="tight", pad_inches=0.15)
    plt.close(fig)
    return path


def _png(stem: Path, suffix: str) -> Path:
    return stem.with_name(stem.name + suffix + ".png")


def _figure(width: float, height: float) -> Figure:
    return plt.figure(figsize=(width, height), layout="constrained")


def _footnote(fig: Figure, text: str) -> None:
    """A note under the figure (savefig's tight bounding box takes it in), wrapped to its width."""
    width = int(fig.get_figwidth() * 15)
    lines = [w for para in text.splitlines() for w in textwrap.wrap(para, width) or [""]]
    fig.text(0.0, -0.01, "\n".join(lines), ha="left", va="top", fontsize=8, color="#333333")


# ----------------------------------------------------------------------------- models


def _ok(results: List[Dict]) -> List[Dict]:
    return [r for r in results if "error" not in r]


def variant_name(variant: str) -> str:
    """irpe_qkv -> 'iRPE-QKV'; plain stays plain."""
    return "iRPE-" + variant[5:].upper() if variant.startswith("irpe_") else variant


def _variants(rows: List[Dict]) -> List[str]:
    found = list(dict.fromkeys(r["variant"] for r in rows))
    rank = {v: i for i, v in enumerate(VARIANT_ORDER)}
    return sorted(found, key=lambda v: (rank.get(v, len(rank)), found.index(v)))


def variant_colours(rows: List[Dict]) -> Dict[str, str]:
    """plain: black; the known iRPE variants a fixed colour each (the same in every report),
    any other variant the next unused one."""
    fixed = {"plain": PLAIN_COLOUR, "irpe_k": PALETTE[0], "irpe_qk": PALETTE[1],
             "irpe_qkv": PALETTE[2], "irpe_q": PALETTE[3], "irpe_v": PALETTE[4],
             "irpe_kv": PALETTE[5]}
    found = _variants(rows)
    spare = iter(c for c in PALETTE if c not in fixed.values())
    out = {}
    for v in found:
        if v in fixed:
            out[v] = fixed[v]
            continue
        try:
            out[v] = next(spare)
        except StopIteration:
            raise ValueError(f"{len(found)} variants: not enough distinct colours") from None
    return out


class _Models:
    """A models report's rows, keyed for the figures: model = family (+ size, + precision where
    the report has several), group = (model, backend), facet = batch."""

    def __init__(self, doc: Dict):
        self.doc = doc
        self.all = doc["results"]
        self.rows = _ok(self.all)
        rows = self.all
        self.many_sizes = len({r["size"] for r in rows}) > 1
        self.many_precisions = len({r["precision"] for r in rows}) > 1
        self.models = list(dict.fromkeys(self.model(r) for r in rows))
        self.backends = list(dict.fromkeys(r["backend"] for r in rows))
        self.groups = list(dict.fromkeys((self.model(r), r["backend"]) for r in rows))
        self.batches = sorted({r["batch"] for r in rows})
        self.variants = _variants(rows)
        self.colour = variant_colours(rows)
        self.index = {(self.model(r), r["backend"], r["batch"], r["variant"]): r for r in rows}

    def model(self, r: Dict) -> str:
        return (r["family"] + (f" {r['size']}" if self.many_sizes else "")
                + (f" {r['precision']}" if self.many_precisions else ""))

    def extra(self) -> List[str]:
        """Settings shared by every row, for the title line."""
        out = []
        if not self.many_precisions and self.all:
            out.append(self.all[0]["precision"])
        if not self.many_sizes and self.all:
            out.append(f"{self.all[0]['size']} input")
        return out

    def row(self, group: Tuple[str, str], batch: int, variant: str) -> Optional[Dict]:
        return self.index.get((*group, batch, variant))

    def ratio(self, group, batch: int, variant: str, value: Callable[[Dict], Optional[float]],
              floor: float = 0.0) -> Tuple[bool, Optional[float], Optional[float],
                                            Optional[float]]:
        """(row exists, value(variant row) / value(plain row), the two values); the ratio is
        None where either failed or the plain value is not above ``floor``."""
        r, p = self.row(group, batch, variant), self.row(group, batch, "plain")
        if r is None:
            return False, None, None, None
        if "error" in r or p is None or "error" in p:
            return True, None, None, None
        a, b = value(r), value(p)
        ok = a is not None and b is not None and b > floor
        return True, (a / b if ok else None), a, b

    def group_label(self, group: Tuple[str, str]) -> str:
        return f"{group[0]}  ·  {group[1]}"


def _layout(groups: Sequence, series_of: Callable[[object], List[str]], gap: float = 0.7
            ) -> Tuple[Dict[Tuple[object, str], float], List[float], float]:
    """y of every (group, series) bar, the centre of every group, the bottom edge."""
    pos: Dict[Tuple[object, str], float] = {}
    centres, y = [], 0.0
    for g in groups:
        names = series_of(g)
        for i, s in enumerate(names):
            pos[(g, s)] = y + i
        centres.append(y + (len(names) - 1) / 2)
        y += len(names) + gap
    return pos, centres, y - gap


def _row_axes(fig: Figure, m: _Models, series: List[str], sharex: bool = True):
    """One panel per batch size, the (model, backend) groups down the y axis; y positions."""
    present = {g: [s for s in series if any(m.row(g, b, s) for b in m.batches)]
               for g in m.groups}
    pos, centres, bottom = _layout(m.groups, lambda g: present[g])
    axes = fig.subplots(1, len(m.batches), sharey=True, sharex=sharex, squeeze=False)[0]
    for ax, batch in zip(axes, m.batches, strict=True):
        ax.set_ylim(bottom + 0.6, -0.6)
        ax.set_yticks(centres, [m.group_label(g) for g in m.groups])
        ax.tick_params(axis="y", length=0)
        for c, g in zip(centres[1:], m.groups[1:], strict=True):
            ax.axhline(c - (len(present[g]) - 1) / 2 - 0.85, color="#cccccc", lw=0.8)
        ax.grid(axis="x", alpha=0.3)
        if len(m.batches) > 1:
            ax.set_title(f"batch {batch}", fontsize=10)
    return axes, pos, bottom


def _rows_width(m: _Models, panels: int) -> float:
    """Figure width: the group labels, ``panels`` panels of 4.2 in, the legend."""
    return 1.7 + 0.075 * max(len(m.group_label(g)) for g in m.groups) + 4.2 * panels


def _rows_height(m: _Models, series: List[str]) -> float:
    bars = sum(sum(1 for s in series if any(m.row(g, b, s) for b in m.batches))
               for g in m.groups)
    return 1.9 + 0.24 * bars + 0.17 * len(m.groups)


def _bar_labels(ax, items: List[Tuple[float, float, float, str]]) -> None:
    """(y, start, end, text) per bar: the text beyond the bar's end, away from its start."""
    for y, start, end, text in items:
        right = end >= start
        ax.annotate(text, (end, y), xytext=(6 if right else -6, 0), textcoords="offset points",
                    ha="left" if right else "right", va="center", fontsize=7.5)


def _span(values: List[float], ref: float, log: bool, right: float = 0.15
          ) -> Tuple[float, float]:
    """Axis limits around ``values`` and ``ref``: the data take the middle, ``right`` of the
    axis is left free on the right for the value labels."""
    lo, hi = min(values + [ref]), max(values + [ref])
    if log:
        d = max(math.log10(hi / lo), 0.3)
        t = d / (0.9 - right)
        return lo / 10 ** (0.1 * t), hi * 10 ** (right * t)
    d = (hi - lo) or 0.1 * hi or 1.0
    t = d / (0.75 - right)
    return lo - 0.25 * t, hi + right * t


def _variant_legend(fig: Figure, m: _Models, series: List[str], title: str = "variant",
                    loc: str = "outside right center", extra: Sequence[Line2D] = ()):
    handles = [Patch(color=m.colour[v], label=variant_name(v))
               for v in series]
    return fig.legend(handles=[*handles, *extra], loc=loc, title=title, fontsize=8,
                      title_fontsize=9, frameon=False)


def _ratio_figure(m: _Models, value: Callable[[Dict], Optional[float]], log: bool,
                  question: str, xlabel: str, note: str, na_note: str,
                  floor: float = 0.0, unit: str = "") -> Figure:
    """Horizontal bars from 1.0 to each iRPE variant's ratio to plain, per group and batch;
    with ``unit``, the labels give both values too."""
    series = [v for v in m.variants if v != "plain"]
    fig = _figure(_rows_width(m, len(m.batches)), _rows_height(m, series))
    axes, pos, _ = _row_axes(fig, m, series)
    values = [m.ratio(g, b, v, value, floor)[1] for g in m.groups for b in m.batches
              for v in series]
    shown = [x for x in values if x is not None and x > 0]
    lo, hi = _span(shown or [1.0], 1.0, log, 0.4 if unit else 0.15)
    na = False
    for ax, batch in zip(axes, m.batches, strict=True):
        labels = []
        for (g, v), y in pos.items():
            ran, r, a, b = m.ratio(g, batch, v, value, floor)
            if not ran:
                continue
            both = (f"  ({a:.0f} / {b:.0f} {unit})" if unit and a is not None
                    and b is not None else "")
            if r is None or r <= 0:
                na = True
                ax.annotate("n/a" + both, (1.0, y), xytext=(5, 0), textcoords="offset points",
                            va="center", fontsize=7.5, color="#555555")
                continue
            ax.barh(y, r - 1.0, left=1.0, height=0.78, color=m.colour[v])
            # with both values the labels are long: right of the bar or of the 1.0 line
            labels.append((y, 1.0, max(r, 1.0) if unit else r,
                           (f"{r:.2f}" if r >= 0.1 else f"{r:.2g}") + both))
        ax.axvline(1.0, color="#222222", lw=1.1, zorder=3)
        if log:
            _log_axis(ax, lo, hi)
        else:
            ax.set_xlim(lo, hi)
        _bar_labels(ax, labels)
    _xlabel(fig, axes, xlabel)
    _variant_legend(fig, m, series)
    _title(fig, question, m.doc, m.extra())
    _footnote(fig, note + (f"\nn/a: {na_note}" if na else ""))
    return fig


def _xlabel(fig: Figure, axes, text: str) -> None:
    """One x label under the panels (per panel, long labels of neighbours would overlap)."""
    if len(axes) > 1:
        fig.supxlabel(text, fontsize=10)
    else:
        axes[0].set_xlabel(text)


def _log_axis(ax, lo: float, hi: float) -> None:
    """Log x axis with ticks written as plain numbers (0.5, 1, 2 ...)."""
    ax.set_xscale("log")
    ax.set_xlim(lo, hi)
    steps = (1, 2, 5) if hi / lo > 20 else (1, 1.5, 2, 3, 5, 7)
    ticks = [round(t * 10.0 ** e, 6) for e in range(-3, 6) for t in steps
             if lo <= t * 10.0 ** e <= hi]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))


def irpe_cost_figure(doc: Dict) -> Figure:
    """iRPE throughput / plain throughput per model, backend and batch (1.0: no cost)."""
    m = _Models(doc)
    return _ratio_figure(
        m, lambda r: r.get("images_per_s"), False,
        "iRPE cost: throughput of each iRPE variant relative to the plain model",
        "iRPE throughput / plain throughput  (1 = no cost, < 1 = slower)",
        "Ratio of medians measured side by side (round-robin) in one run, same backend, batch "
        "and input; bars start at 1.0.", "no plain or no variant measurement (error).")


def memory_figure(doc: Dict) -> Figure:
    """Memory growth (build + first forward) of each iRPE variant / the plain model's."""
    m = _Models(doc)
    cuda = str(doc.get("settings", {}).get("device", "cpu")).startswith("cuda")
    what = ("GPU memory allocated" if cuda else "process RSS")
    return _ratio_figure(
        m, lambda r: r.get("rss_delta_mb"), True,
        "iRPE memory: growth of each iRPE variant relative to the plain model",
        f"growth of {what} over build + first forward, iRPE / plain  (log scale)",
        f"Growth of {what} while building a model and running its first forward (the JSON's "
        "rss_delta_mb), iRPE variant / plain model of the same backend and batch; in "
        "brackets: iRPE / plain MB."
        + ("" if cuda else "\nOn a CPU the process reuses memory freed by the model built "
           "before, so RSS growths are rough; peak RSS of the run: the report's peak MB."),
        f"the plain model grew by less than {MEMORY_MIN_MB:g} MB or the variant did not grow "
        "(freed memory reused): no ratio." if not cuda else
        f"the plain model grew by less than {MEMORY_MIN_MB:g} MB: no ratio.", MEMORY_MIN_MB,
        "MB")


def latency_figure(doc: Dict) -> Figure:
    """p50 (dot), p90 (tick) and p99 (line end) of one batch forward per group and variant."""
    m = _Models(doc)
    series = m.variants
    fig = _figure(_rows_width(m, len(m.batches)), _rows_height(m, series))
    axes, pos, _ = _row_axes(fig, m, series, sharex=False)
    for ax, batch in zip(axes, m.batches, strict=True):
        spans = []
        for (g, v), y in pos.items():
            r = m.row(g, batch, v)
            if r is None or "error" in r or r.get("p50_ms") is None:
                continue
            p50, p90, p99 = r["p50_ms"], r.get("p90_ms") or r["p50_ms"], r.get("p99_ms")
            p99 = p99 or p90
            c = m.colour[v]
            ax.plot([p50, p99], [y, y], color=c, lw=2.2, solid_capstyle="butt")
            ax.plot([p90], [y], marker="|", ms=11, mew=2, color=c)
            ax.plot([p99], [y], marker="|", ms=7, mew=1.2, color=c)
            ax.plot([p50], [y], marker="o", ms=6, color=c, mec="white", mew=0.8, zorder=4)
            ax.annotate(f"{p50:.0f} ms", (p99, y), xytext=(5, 0), textcoords="offset points",
                        va="center", fontsize=7.5)
            spans += [p50, p99]
        if spans:
            log = max(spans) / min(spans) > 8
            lo, hi = min(spans), max(spans)
            if log:
                _log_axis(ax, lo / 1.3, hi * 2.2)
            else:
                d = (hi - lo) or hi
                ax.set_xlim(lo - 0.08 * d, hi + 0.35 * d)
        ax.set_xlabel("latency (ms" + (", log scale)" if spans and log else ")"))
    key = [Line2D([], [], color="#555555", marker="o", ls="", label="p50 (value shown)"),
           Line2D([], [], color="#555555", marker="|", ms=11, mew=2, ls="", label="p90"),
           Line2D([], [], color="#555555", marker="|", ms=7, ls="", label="p99 (line end)")]
    _variant_legend(fig, m, series, extra=key)
    _title(fig, "Latency per forward of the whole batch: p50, p90, p99", m.doc, m.extra())
    repeats = doc.get("settings", {}).get("repeats")
    _footnote(fig, "Nearest-rank percentiles of the timed rounds"
              + (f" ({repeats} per model: p90 = p99 = the slowest)" if repeats
                 and repeats < 10 else "") + ".")
    return fig


def throughput_figure(doc: Dict) -> Figure:
    """images/s vs batch per backend (colour = model, line style = variant); one batch: bars."""
    m = _Models(doc)
    if len(m.batches) < 2:
        return _throughput_bars(m)
    model_colour = dict(zip(m.models, colours(len(m.models)), strict=True))
    style = dict(zip(m.variants, (STYLES[i % len(STYLES)] for i in range(len(m.variants))),
                     strict=True))
    fig = _figure(1.8 + 3.9 * len(m.backends), 4.6)
    axes = fig.subplots(1, len(m.backends), sharey=True, squeeze=False)[0]
    values = [r["images_per_s"] for r in m.rows if r.get("images_per_s")]
    for ax, backend in zip(axes, m.backends, strict=True):
        for model in m.models:
            for v in m.variants:
                pts = sorted((b, r["images_per_s"]) for b in m.batches
                             if (r := m.row((model, backend), b, v)) and "error" not in r
                             and r.get("images_per_s"))
                if not pts:
                    continue
                ls, mk = style[v]
                ax.plot([p[0] for p in pts], [p[1] for p in pts], ls=ls, marker=mk, ms=6,
                        color=model_colour[model], lw=1.6)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(m.batches))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
        ax.set_xlim(m.batches[0] / 1.4, m.batches[-1] * 1.4)
        ax.set_title(backend, fontsize=10)
        ax.set_xlabel("batch size (images per forward)")
        ax.grid(alpha=0.3, which="both")
    if values and max(values) / min(values) > 8:
        _log_y(axes[0], min(values), max(values))
    axes[0].set_ylabel("throughput (images / s)" + ("  (log scale)" if values and max(values)
                                                     / min(values) > 8 else ""))
    _sections_legend(fig, {
        "model (colour)": [Line2D([], [], color=model_colour[mo], lw=2.5, label=mo)
                           for mo in m.models],
        "variant (line, marker)": [Line2D([], [], color="#555555", ls=style[v][0],
                                          marker=style[v][1], label=variant_name(v))
                                   for v in m.variants]})
    _title(fig, "Throughput vs batch size", m.doc, m.extra())
    return fig


def _sections_legend(fig: Figure, sections: Dict[str, List[Line2D]]):
    """One legend right of the panels with a bold heading per section (a figure legend in the
    top corner would run into the title)."""
    handles: List[Line2D] = []
    heads = []
    for head, items in sections.items():
        heads.append(len(handles))
        handles += [Line2D([], [], ls="", label=head), *items]
    leg = fig.legend(handles=handles, loc="outside right center", fontsize=8, frameon=False,
                     handlelength=3.2)
    for i in heads:
        leg.get_texts()[i].set_fontweight("bold")
    return leg


def _log_y(ax, lo: float, hi: float) -> None:
    ax.set_yscale("log")
    ticks = [t * 10 ** e for e in range(-2, 6) for t in (1, 2, 5) if lo / 1.5 <= t * 10 ** e
             <= hi * 1.5]
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    ax.set_ylim(lo / 1.5, hi * 1.5)


def _throughput_bars(m: _Models) -> Figure:
    """One batch size: images/s per (model, backend), a bar per variant (a dot on a log axis
    where the values span more than 8x)."""
    series = m.variants
    batch = m.batches[0] if m.batches else 1
    fig = _figure(_rows_width(m, 1), _rows_height(m, series))
    axes, pos, _ = _row_axes(fig, m, series)
    ax, labels = axes[0], []
    rows = {(g, v): m.row(g, batch, v) for g, v in pos}
    values = [r["images_per_s"] for r in rows.values()
              if r and "error" not in r and r.get("images_per_s")]
    log = bool(values) and max(values) / min(values) > 8
    lo = min(values or [1.0]) / 1.6 if log else 0.0
    for (g, v), y in pos.items():
        r = rows[(g, v)]
        if r is None:
            continue
        if "error" in r or not r.get("images_per_s"):
            ax.annotate("error", (lo, y), xytext=(4, 0), textcoords="offset points",
                        va="center", fontsize=7.5, color="#555555")
            continue
        x = r["images_per_s"]
        if log:
            ax.hlines(y, lo, x, color=m.colour[v], lw=1.2)
            ax.plot([x], [y], marker="o", ms=7, color=m.colour[v])
        else:
            ax.barh(y, x, height=0.78, color=m.colour[v])
        labels.append((y, lo, x, _sig(x)))
    if log:
        _log_axis(ax, lo, max(values) * 1.8)
    else:
        ax.set_xlim(0, 1.15 * max(values or [1.0]))
    _bar_labels(ax, labels)
    ax.set_xlabel(f"throughput at batch {batch} (images / s" + (", log scale)" if log else ")"))
    _variant_legend(fig, m, series)
    _title(fig, f"Throughput per model and backend, batch {batch}", m.doc, m.extra())
    return fig


def _sig(x: float) -> str:
    """Three significant digits, trailing zeros kept (0.140, 6.17, 11.5, 132)."""
    return f"{x:.0f}" if x >= 100 else f"{x:#.3g}"


MODEL_FIGURES: Dict[str, Callable[[Dict], Figure]] = {
    "_irpe_cost": irpe_cost_figure, "_throughput": throughput_figure,
    "_latency": latency_figure, "_memory": memory_figure}


def models_plots(doc: Dict, stem: Path) -> List[Path]:
    """The four figures of a models report (MODEL_FIGURES), saved next to ``stem``."""
    if not _ok(doc["results"]):
        return []
    return [_save(make(doc), _png(stem, suffix)) for suffix, make in MODEL_FIGURES.items()]


# ----------------------------------------------------------------------------- ops


def _series(rows: List[Dict], key: Callable[[Dict], str], x: str, y: str
            ) -> Dict[str, List[Tuple[float, float]]]:
    out: Dict[str, List[Tuple[float, float]]] = defaultdict(list)
    for r in rows:
        if r.get(y) is not None:
            out[key(r)].append((r[x], r[y]))
    return {k: sorted(v) for k, v in out.items()}


def ops_series(doc: Dict) -> Dict[str, List[Tuple[float, float]]]:
    """(L, ms) per op, labelled with the op's fitted exponent."""
    slopes = {f["op"]: f["slope"] for f in doc.get("fits") or fits(doc["results"])}

    def key(r: Dict) -> str:
        p = slopes.get(series_key(r))
        return series_key(r) + ("" if p is None else f" (fitted p={p:.2f})")
    return _series(fit_rows(doc["results"]), key, "L", "median_ms")


def ops_figure(doc: Dict) -> Figure:
    """Op time vs L, log-log: a colour per op, dashed for the official implementation."""
    series = ops_series(doc)
    fig = _figure(8.2, 4.8)
    ax = fig.subplots()
    for (label, pts), c in zip(series.items(), colours(len(series)), strict=True):
        ls = "--" if "official" in label else "-"
        ax.plot([p[0] for p in pts], [p[1] for p in pts], ls=ls, marker="o", ms=5, color=c,
                label=label, lw=1.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    lengths = sorted({p[0] for pts in series.values() for p in pts})
    if lengths:
        ax.xaxis.set_major_locator(FixedLocator(lengths))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    ax.grid(alpha=0.3, which="major")
    ax.set(xlabel="sequence length L (tokens)  (log scale)",
           ylabel="median time per call (ms)  (log scale)")
    if series:
        fig.legend(loc="outside right center", title="op (t ~ L^p, least squares)", fontsize=8,
                   title_fontsize=9, frameon=False)
    heads = doc.get("settings", {}).get("heads")
    extra = [f"{heads} heads, head dim {doc['settings'].get('head_dim')}"] if heads else []
    _title(fig, "iRPE op cost vs sequence length", doc, extra)
    return fig


def ops_plots(doc: Dict, stem: Path) -> List[Path]:
    """Op cost vs sequence length L, log-log; the legend gives each op's fitted exponent."""
    return [_save(ops_figure(doc), _png(stem, "_cost_vs_L"))]


# ----------------------------------------------------------------------------- serve


def serve_figure(doc: Dict) -> Figure:
    """Per model (a row): HTTP throughput vs clients with the in-process and backend-only rates
    for reference, latency percentiles vs clients, and the server's batch sizes."""
    models = list(dict.fromkeys(r.get("model", "-") for r in doc["results"]))
    hists = doc.get("batch_histogram", {})
    closed = sorted({r["mode"] for r in doc["results"] if r["mode"].startswith("closed")},
                    key=lambda s: (len(s), s))
    # label -> (line style, marker); a colour each, no colour shared by two series
    style = {**{_serve_label("HTTP", c): ("-", "o") for c in closed},
             "in-process (no HTTP)": ("--", ""), "backend only": (":", ""),
             **{_serve_label(f"p{q}", c): (ls, "o") for c in closed
                for q, ls in ((50, "-"), (90, "--"), (99, ":"))}}
    colour = dict(zip(style, colours(len(style)), strict=True))
    fig = _figure(12.5, 0.8 + 3.4 * len(models))
    axes = fig.subplots(len(models), 3, squeeze=False)

    def line(ax, label: str, pts: List[Tuple[float, float]], ms: float = 6) -> None:
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], ls=style[label][0],
                    marker=style[label][1], ms=ms, color=colour[label], lw=1.6)
    for (a, b, c), model in zip(axes, models, strict=True):
        rows = [r for r in doc["results"] if r.get("model", "-") == model]
        for mode in closed:
            mine = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["load"])
            line(a, _serve_label("HTTP", mode), [(r["load"], r["images_per_s"]) for r in mine])
            for q in (50, 90, 99):
                line(b, _serve_label(f"p{q}", mode), [(r["load"], r[f"p{q}_ms"]) for r in mine
                                                     if r.get(f"p{q}_ms") is not None], ms=4)
        for mode, label in (("in-process", "in-process (no HTTP)"), ("backend", "backend only")):
            for r in (r for r in rows if r["mode"] == mode):
                a.axhline(r["images_per_s"], color=colour[label], ls=style[label][0], lw=1.4)
        a.set_ylim(bottom=0)
        a.set(xlabel="concurrent clients (closed loop)", ylabel="throughput (images / s)",
              title=f"{model}: throughput")
        b.set(xlabel="concurrent clients (closed loop)", ylabel="latency per request (ms)",
              title=f"{model}: latency")
        hist = hists.get(model, hists if model == "-" else {})  # "-": older one-model reports
        c.bar([str(k) for k in hist], list(hist.values()), color="#999999")
        c.set(xlabel="batch size run by the server (upper bound)", ylabel="number of batches",
              title=f"{model}: server batch sizes")
        for ax in (a, b, c):
            ax.grid(alpha=0.3)
    handles = [Line2D([], [], color=colour[lb], ls=ls, marker=mk, label=lb)
               for lb, (ls, mk) in style.items()]
    fig.legend(handles=handles, loc="outside right center", fontsize=8, frameon=False,
               handlelength=3)
    s = doc.get("settings", {})
    _title(fig, "Serving: throughput, latency and batching under load", doc,
           [f"backend {s.get('backend', '?')}", f"max batch {s.get('max_batch_size', '?')}"])
    return fig


def _serve_label(what: str, mode: str) -> str:
    """'HTTP' + 'closed x8' -> 'HTTP, 8 images / request'; plain 'closed' -> 'HTTP'."""
    n = mode.partition(" x")[2]
    return f"{what}, {n} images / request" if n else what


def serve_plots(doc: Dict, stem: Path) -> List[Path]:
    """Per model: closed-loop throughput and latency vs clients; the server's batch sizes."""
    return [_save(serve_figure(doc), _png(stem, ""))]


PLOTS: Dict[str, Callable[[Dict, Path], List[Path]]] = {
    "models": models_plots, "ops": ops_plots, "serve": serve_plots}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """`python -m benchmarks.plots REPORT.json ...`: redraw the PNGs of saved reports."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.plots", description="Redraw the PNG "
                                "figures of saved `irpe bench` reports (JSON), next to them.")
    p.add_argument("reports", nargs="+", type=Path, help="bench_<kind>[_<tag>].json files")
    args = p.parse_args(argv)
    for path in args.reports:
        doc = json.loads(path.read_text())
        if doc.get("kind") not in PLOTS:
            print(f"{path}: not a models, ops or serve report of `irpe bench` (kind "
                  f"{doc.get('kind')!r})", file=sys.stderr)
            return 2
        for out in PLOTS[doc["kind"]](doc, path.with_suffix("")):
            print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
