"""What ``irpe tune`` writes besides the tuned repository file: the table of every candidate
(Markdown), one plot (throughput vs p99, the Pareto front marked, device and date in the title)
and Triton's ``config.pbtxt`` of the tuned model (as ``irpe serve`` answers it on
``/v2/models/{name}/config``: irpe.artifact.triton_config, the one writer of that format).
"""
from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .goal import Goal
from .search import Outcome
from .space import Candidate

__all__ = ["Point", "points", "pareto", "change", "table", "plot", "pbtxt_text"]

Point = Tuple[Candidate, float, float, str]  # candidate, img/s, p99 ms, stage
LABELLED = 15  # plots with at most this many points name each; larger ones the front only


def points(outcome: Outcome, goal: Goal) -> List[Point]:
    """Every measured candidate at the goal's main load: its full run where it has one."""
    out = []
    for cand, entry in outcome.entries.items():
        stage = "full" if "full" in entry else "short" if "short" in entry else None
        if stage:
            row = goal.main_row(entry[stage])
            if row.get("p99_ms") is not None:
                out.append((cand, row["images_per_s"], row["p99_ms"], stage))
    return out


def pareto(pts: Sequence[Point]) -> List[Point]:
    """The points no other point beats on both throughput (higher) and p99 (lower), by p99."""
    front = [p for p in pts if not any(q[1] >= p[1] and q[2] <= p[2] and (q[1], q[2]) !=
                                       (p[1], p[2]) for q in pts)]
    return sorted(front, key=lambda p: p[2])


def change(cand: Candidate, start: Optional[Candidate]) -> str:
    """What ``cand`` changes from ``start`` (the default), in the label's terms: 'int8 b16/10ms'
    ('default' for the default itself); the whole label without a start."""
    if start is None:
        return cand.label()
    words, base = cand.label().split(), start.label().split()
    if cand.backend != start.backend:  # streams come and go with openvino: show them all
        return cand.label()
    diff = [w for w, b in zip(words, base, strict=False) if w != b]
    return " ".join(diff) or "default"


def _cell(result: Optional[Dict[str, Any]], goal: Goal) -> List[str]:
    if not result:
        return ["", "", ""]
    row = goal.main_row(result)
    return [f"{row.get('images_per_s', 0):.1f}", f"{row.get('p50_ms', float('nan')):.1f}",
            f"{row.get('p99_ms', float('nan')):.1f}"]


def table(outcome: Outcome, goal: Goal, header: Sequence[str]) -> str:
    """Markdown: ``header`` lines, then one row per candidate (best first, then by score)."""
    head = ["status", "backend", "precision", "batch", "delay ms", "instances", "threads",
            "streams", "short img/s", "short p50", "short p99", "full img/s", "full p50",
            "full p99", "notes"]

    def order(item: Tuple[Candidate, Dict[str, Any]]) -> Tuple:
        entry = item[1]
        stage = "full" if "full" in entry else "short" if "short" in entry else ""
        return (entry["status"] == "best", stage == "full",
                goal.score(entry[stage]) if stage else (-1, 0.0))
    lines = [*header, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for cand, entry in sorted(outcome.entries.items(), key=order, reverse=True):
        status = "not measured" if entry["status"] == "new" else entry["status"]
        misses = [m for stage in ("full", "short") if stage in entry
                  for m in goal.violations(entry[stage])][:1]
        note = entry.get("detail") or "; ".join(misses)
        default = " (default)" if cand == outcome.start else ""
        cells = [status + default, cand.backend, cand.precision, str(cand.max_batch_size),
                 f"{cand.max_queue_delay_ms:g}", str(cand.instances), str(cand.threads),
                 "-" if cand.ov_streams is None else str(cand.ov_streams),
                 *_cell(entry.get("short"), goal), *_cell(entry.get("full"), goal),
                 note.replace("|", "/")]
        lines.append("| " + " | ".join(cells) + " |")
    if outcome.notes:
        lines += ["", *[f"- {n}" for n in outcome.notes]]
    return "\n".join(lines) + "\n"


def plot(outcome: Outcome, goal: Goal, title: str, path: Path) -> None:
    """Throughput vs p99 of every measured candidate at the goal's main load: full runs filled,
    short runs hollow, the Pareto front joined, the best starred, the default ringed, the SLO
    a dashed line."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    pts = points(outcome, goal)
    fig, ax = plt.subplots(figsize=(9, 6), dpi=110)
    for stage, face in (("short", "none"), ("full", "tab:blue")):
        own = [p for p in pts if p[3] == stage]
        ax.scatter([p[2] for p in own], [p[1] for p in own], s=50, facecolors=face,
                   edgecolors="tab:blue", label=f"{stage} run ({len(own)})", zorder=3)
    front = pareto(pts)
    ax.plot([p[2] for p in front], [p[1] for p in front], "-o", color="tab:orange", lw=2,
            ms=9, label="Pareto front (nothing both faster and lower p99)", zorder=2)
    named = pts if len(pts) <= LABELLED else front  # every point named while they are few
    middle = sum(ax.get_xlim()) / 2
    placed: List[Any] = []  # display coordinates of the points named so far
    for cand, rate, p99, _ in named:
        on_front = any(cand == p[0] for p in front)
        right = p99 > middle  # labels left of the points in the right half: never clipped
        at = ax.transData.transform((p99, rate))
        below = sum(abs(at[0] - x) < 20 and abs(at[1] - y) < 20 for x, y in placed)
        placed.append(at)  # a point on top of another: its label one line lower
        ax.annotate(change(cand, outcome.start), (p99, rate), textcoords="offset points",
                    xytext=(-8 if right else 8, -12 - 10 * below),
                    ha="right" if right else "left", fontsize=8,
                    color="tab:orange" if on_front else "dimgray")
    if outcome.best:
        best = next((p for p in pts if p[0] == outcome.best["candidate"]), None)
        if best:
            ax.scatter([best[2]], [best[1]], marker="*", s=400, color="tab:red", zorder=4,
                       label=f"tuned: {best[0].label()}")
    start = next((p for p in pts if p[0] == outcome.start), None)
    if start:
        ax.scatter([start[2]], [start[1]], s=220, facecolors="none", edgecolors="black",
                   lw=2, zorder=4, label=f"default: {start[0].label()}")
    if goal.p99_ms:
        ax.axvline(goal.p99_ms, ls="--", color="gray", label=f"SLO p99 {goal.p99_ms:g} ms")
    most = max(goal.clients)
    load = f"{goal.rate:g} req/s" if goal.rate else f"{most} client{'s' * (most > 1)}"
    ax.set_xlabel(f"p99 latency (ms) at {load}")
    ax.set_ylabel(f"throughput (images/s) at {load}")
    # a long model name must not run off the figure: each title line wrapped to its width
    ax.set_title("\n".join(textwrap.fill(line, 90) for line in title.splitlines()), fontsize=11)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)


def pbtxt_text(config: Dict[str, Any]) -> str:
    """Triton's config.pbtxt of a model configuration dict (irpe.artifact.triton_config)."""
    from irpe.artifact.triton_config import pbtxt
    return "\n".join(pbtxt(config)) + "\n"
