"""Report files of `irpe bench`: JSON (env + settings + rows), Markdown tables and PNG plots.

Every benchmark writes ``bench_<kind>.json`` under benchmarks/results/<device>/; `irpe bench
report` rebuilds ``bench_<kind>.md`` and ``bench_<kind>_*.png`` from those JSON files alone.
"""
from __future__ import annotations

import importlib.metadata as md
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from benchmarks.common import device_slug
from benchmarks.fits import fits
from irpe.errors import InvalidInput

RESULTS = Path(__file__).parent / "results"
KINDS = ("models", "ops", "serve")


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank q-th percentile (0..100) of ``samples``."""
    data = sorted(samples)
    return data[min(len(data) - 1, max(0, int(round(q / 100 * (len(data) - 1)))))]


def latency_ms(samples_s: Sequence[float]) -> Dict[str, float]:
    """p50/p90/p99 (ms) of per-call seconds."""
    return {f"p{q}_ms": percentile(samples_s, q) * 1e3 for q in (50, 90, 99)}


def git_sha() -> str:
    """Commit of the working tree ('unknown' outside git)."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, cwd=Path(__file__).parent, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def versions() -> Dict[str, str]:
    """Versions of Python and the libraries that set the numbers."""
    out = {"python": platform.python_version()}
    for pkg in ("torch", "onnxruntime", "numpy", "fastapi", "uvicorn", "httpx"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


def envelope(kind: str, settings: Dict, results: List[Dict], notes: Sequence[str] = ()) -> Dict:
    """The JSON document of one benchmark run."""
    import torch
    return {"kind": kind, "device": device_slug(), "date": time.strftime("%Y-%m-%d %H:%M"),
            "git_sha": git_sha(), "versions": versions(), "cpu_count": _cpus(),
            "torch_threads": torch.get_num_threads(), "settings": settings,
            "notes": list(notes), "results": results}


def _cpus() -> Optional[int]:
    return os.cpu_count()


def write_json_md(folder: Path, stem: str, result: Dict, lines: Sequence[str]) -> Path:
    """``stem``.json (the result) and ``stem``.md (the lines) in ``folder``; the .md path."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    path = folder / f"{stem}.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def out_dir(given: Optional[Path]) -> Path:
    """The folder reports go to (default benchmarks/results/<device>)."""
    return Path(given) if given else RESULTS / device_slug()


def save(doc: Dict, folder: Path, tag: Optional[str] = None) -> List[Path]:
    """Write bench_<kind>[_<tag>].json, then the Markdown and plots; returns every file written."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"bench_{doc['kind']}{'_' + tag if tag else ''}.json"
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return [path] + render(path)


def render(path: Path) -> List[Path]:
    """bench_<kind>[_<tag>].json -> the .md of the same stem + PNG plots next to it (plots
    only where matplotlib is installed: the JSON and Markdown are the results)."""
    doc = json.loads(Path(path).read_text())
    kind = doc.get("kind")
    if kind not in KINDS:
        raise InvalidInput(f"{path}: not an irpe bench report (kind {kind!r})")
    header, rows = TABLES[kind](doc["results"])
    md = path.with_suffix(".md")
    md.write_text(markdown(doc, header, rows) + "".join(
        section(doc) for section in SECTIONS.get(kind, ())))
    return [md] + _plots(kind, doc, path.with_suffix(""))


def _plots(kind: str, doc: Dict, stem: Path) -> List[Path]:
    """The kind's PNG plots; none, with one line on stderr, when matplotlib is missing."""
    try:
        from benchmarks import plots
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "matplotlib":
            raise
        print(f"irpe bench: no plots for {stem.name} (matplotlib is not installed; the bench "
              "extra has it, then `irpe bench report` draws them)", file=sys.stderr)
        return []
    return plots.PLOTS[kind](doc, stem)


def markdown(doc: Dict, header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Title, environment line, notes and one table."""
    v = doc["versions"]
    lines = [f"# irpe bench {doc['kind']} on {doc['device']}", "",
             f"{doc['date']}, git {doc['git_sha']}, torch {v.get('torch', '-')}, onnxruntime "
             f"{v.get('onnxruntime', '-')}, {doc['cpu_count']} CPUs, torch threads "
             f"{doc['torch_threads']}. Settings: `{json.dumps(doc['settings'])}`", ""]
    lines += [f"- {n}" for n in doc.get("notes", [])]
    lines += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _f(value, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def models_table(results: List[Dict]):
    """One row per (model, backend, precision, batch, size)."""
    header = ["family", "variant", "backend", "prec", "size", "batch", "img/s", "p50 ms",
              "p90 ms", "p99 ms", "x plain", "RSS+ MB", "peak MB", "build s"]
    rows = [[r["family"], r["variant"], r["backend"], r["precision"], r["size"], str(r["batch"]),
             _f(r.get("images_per_s")), _f(r.get("p50_ms")), _f(r.get("p90_ms")),
             _f(r.get("p99_ms")), _f(r.get("overhead_vs_plain"), ".3f"),
             _f(r.get("rss_delta_mb"), ".0f"), _f(r.get("peak_mb"), ".0f"),
             _f(r.get("build_s"), ".1f")]
            if "error" not in r else [r["family"], r["variant"], r["backend"], r["precision"],
                                      r["size"], str(r["batch"]), f"error: {r['error']}"]
            + ["-"] * 7 for r in results]
    return header, rows


def ops_table(results: List[Dict]):
    """One row per (CPU op variant, L)."""
    header = ["op", "L", "median ms", "growth p", "official / irpe"]
    rows = [[r["op"], str(r["L"]), _f(r["median_ms"], ".3f"), _f(r.get("growth"), ".2f"),
             _f(r.get("speedup"), ".2f")] for r in results if r.get("device") != "cuda"]
    return header, rows


def _table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["", f"## {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


def ops_fits(doc: Dict) -> str:
    """Fitted growth exponent per op (stored fits, or fitted now for older reports)."""
    rows = [[f["op"], _f(f["slope"], ".2f"), ", ".join(map(str, f["lengths"]))]
            for f in doc.get("fits") or fits(doc["results"])]
    return _table("Fitted growth: t ~ L^p (least squares, log-log)", ["op", "fitted p", "L"], rows)


def ops_gpu(doc: Dict) -> str:
    """Custom CUDA kernel rows, or the reason there are none."""
    gpu = [r for r in doc["results"] if r.get("device") == "cuda"]
    if not gpu:
        return f"\nCustom CUDA kernels: {doc['settings'].get('gpu_ops', 'not run')}\n"
    rows = [[r["case"], r["dtype"], r["op"], str(r["L"]), _f(r["median_ms"], ".4f"),
             _f(r.get("gb_per_s"), ".0f"), _f((r.get("fraction_of_peak") or 0) * 100, ".1f"),
             _f(r.get("speedup"), ".2f")] for r in gpu]
    return _table("CUDA (benchmarks.ops_gpu)", ["case", "dtype", "op", "L", "median ms", "GB/s",
                                                  "% peak", "x torch"], rows)


def serve_table(results: List[Dict]):
    """One row per model and load level (closed-loop clients, open-loop rate, in-process)."""
    header = ["model", "mode", "load", "requests", "img/s", "p50 ms", "p90 ms", "p99 ms",
              "errors", "HTTP / in-process"]
    rows = [[r.get("model", "-"), r["mode"], str(r["load"]), str(r.get("requests", "-")),
             _f(r.get("images_per_s")), _f(r.get("p50_ms")), _f(r.get("p90_ms")),
             _f(r.get("p99_ms")), json.dumps(r.get("errors", {})) if r.get("errors") else "0",
             _f(r.get("ratio_to_inprocess"), ".3f")] for r in results]
    return header, rows


TABLES: Dict[str, Callable] = {"models": models_table, "ops": ops_table, "serve": serve_table}
SECTIONS: Dict[str, Sequence[Callable[[Dict], str]]] = {"ops": (ops_fits, ops_gpu)}
