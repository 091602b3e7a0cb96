"""One candidate measured as users run it: its repository file served by its own ``irpe serve``
process, under the load generator of ``irpe bench serve`` (benchmarks.serve_load: closed-loop
clients on keep-alive connections, warm-up not recorded; an open-loop rate), every request the
same image. The repository file measured is the one :func:`repository` writes, the same
function that writes the tuned file, so what was measured is what is served.
"""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Dict

from .accuracy import ModelFiles
from .goal import Goal, load_key
from .search import MeasureFailed
from .space import Candidate
from .target import Target

__all__ = ["repository", "ServeMeasure", "ROW_KEYS"]

ROW_KEYS = ("images_per_s", "p50_ms", "p90_ms", "p99_ms", "errors", "requests", "seconds")


def repository(target: Target, cand: Candidate, path: Path) -> Dict[str, Any]:
    """The repository file (as a dict) that serves ``target`` as ``cand``: the model's file
    for the candidate's precision (absolute, so the file runs from anywhere), its batching,
    instances and streams, the server's threads, and the repository's other settings."""
    model: Dict[str, Any] = {"name": target.name, "path": str(Path(path).resolve()),
                             "backend": cand.backend, **target.model_keys,
                             "max_batch_size": cand.max_batch_size,
                             "max_queue_delay_ms": cand.max_queue_delay_ms,
                             "instances": cand.instances}
    model.setdefault("max_queue_size", max(64, 4 * cand.max_batch_size))
    if cand.precision == "bf16":
        model["precision"] = "bf16"
    if cand.ov_streams is not None:
        model["ov_streams"] = cand.ov_streams
    return {**target.server, "threads": cand.threads, "models": [model]}


def write_yaml(path: Path, data: Dict[str, Any]) -> None:
    """``data`` as YAML at ``path``, atomically (irpe.atomic)."""
    import yaml

    from irpe.atomic import write_text
    write_text(path, yaml.safe_dump(data, sort_keys=False))


def image(target: Target) -> bytes:
    """The one request image: a shapes image at the model's input size, PNG."""
    from benchmarks.serve_load import png
    return png(target.size)


class ServeMeasure:
    """``measure(candidate, seconds)``: the candidate's server started in ``folder``, each of
    the goal's loads run for ``seconds`` after ``warmup_s`` of unrecorded load, the server
    stopped; the rows by load key (serve.tune.goal)."""

    def __init__(self, target: Target, files: ModelFiles, goal: Goal, folder: Path,
                 warmup_s: float = 1.0, start_timeout_s: float = 300.0) -> None:
        self.target, self.files, self.goal, self.folder = target, files, goal, folder
        self.warmup_s, self.start_timeout_s = warmup_s, start_timeout_s
        self.body = image(target)
        verb = "classify?top_k=1" if target.task == "classification" else "detect"
        self.path = f"/v1/models/{target.name}/{verb}"

    def __call__(self, cand: Candidate, seconds: float) -> Dict[str, Dict[str, Any]]:
        from benchmarks.serve_load import server_process
        try:
            model_file = self.files.path(cand)
        except RuntimeError as exc:
            raise MeasureFailed(str(exc)) from None
        folder = self.folder / "runs" / cand.key("")
        folder.mkdir(parents=True, exist_ok=True)
        repo = folder / "repository.yaml"
        write_yaml(repo, repository(self.target, cand, model_file))
        try:
            with server_process(repo, cand.threads, self.start_timeout_s) as base:
                return self.loads(base, seconds)
        except (RuntimeError, TimeoutError) as exc:
            raise MeasureFailed(" ".join(str(exc).split())[-300:]) from None

    def loads(self, base: str, seconds: float) -> Dict[str, Dict[str, Any]]:
        """Every load of the goal against the server at ``base``."""
        from benchmarks.serve_load import lean_closed_loop, open_loop
        headers = {"content-type": "image/png"}
        out: Dict[str, Dict[str, Any]] = {}
        for kind, load in self.goal.loads():
            if kind == "closed":
                row = asyncio.run(lean_closed_loop(base, self.path, self.body, headers,
                                                   int(load), seconds, self.warmup_s))
                out[load_key("c", load)] = {k: row[k] for k in ROW_KEYS if k in row}
            else:
                row = asyncio.run(open_loop(base, self.path, load, seconds, self.body,
                                            "image/png"))
                out[load_key("r", load)] = {k: row[k] for k in ROW_KEYS if k in row}
        return out
