"""The files each candidate serves, and the accuracy gate of reduced precisions.

int8 is the model quantised on demand by ``irpe quantize --target openvino`` (NNCF, calibrated
on the validation data or shapes) into the tune's folder; bf16 is the same file compiled in
bf16. A reduced precision is served only when ``irpe eval`` on the validation data gives a
score within ``margin`` points of fp32's (top-1 for a classifier, AP50 for a detector): the
commands users run, in their own processes, so the gate checks exactly what they would.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

from .space import Candidate
from .target import Target

__all__ = ["ModelFiles", "AccuracyGate", "METRICS"]

METRICS = {"classification": "top1", "detection": "AP50"}


def _irpe(args: List[str], what: str) -> None:
    """``python -m irpe ARGS``; RuntimeError with its last lines when it fails."""
    done = subprocess.run([sys.executable, "-m", "irpe", *args], capture_output=True, text=True)
    if done.returncode:
        tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise RuntimeError(f"{what} failed (exit {done.returncode}): {tail}")


class ModelFiles:
    """The model file of each candidate; the int8 IR made once in ``folder`` when asked for."""

    def __init__(self, target: Target, folder: Path, calibration: str = "shapes") -> None:
        self.target, self.folder, self.calibration = target, folder, calibration

    def int8(self) -> Path:
        """The int8 OpenVINO IR of the model's ONNX file (``irpe quantize``), made when
        missing or older than the ONNX file."""
        onnx = self.target.files.get("onnx")
        if onnx is None:
            raise RuntimeError("int8 needs the model's .onnx file (irpe quantize reads it)")
        out = self.folder / f"{self.target.name}.int8.xml"
        if not out.is_file() or out.stat().st_mtime < onnx.stat().st_mtime:
            self.folder.mkdir(parents=True, exist_ok=True)
            _irpe(["quantize", str(onnx), "-o", str(out), "--target", "openvino",
                   "--calibration", self.calibration, "--samples", "64"], "irpe quantize")
        return out

    def path(self, cand: Candidate) -> Path:
        """The file ``cand`` serves: the int8 IR, the weights (torch), else the .onnx / IR."""
        if cand.precision == "int8":
            return self.int8()
        files = self.target.files
        if cand.backend == "torch":
            return files["weights"]
        return files.get("onnx") or files["ir"]


class AccuracyGate:
    """``gate(candidate) -> (ok, detail)``: the candidate's score on ``data`` (a folder of
    the user's validation images, or ``shapes``) within ``margin`` points of fp32's."""

    def __init__(self, files: ModelFiles, data: str, margin: float, shapes_val: int = 500,
                 threads: int = 2) -> None:
        self.files, self.data, self.margin = files, data, margin
        self.shapes_val, self.threads = shapes_val, threads
        self.metric = METRICS[files.target.task]
        self.scores: Dict[Tuple[str, str], float] = {}

    def score(self, file: Path, runtime: str, precision: str = "fp32") -> float:
        """``irpe eval`` of ``file`` on ``runtime`` (and OpenVINO ``precision``)."""
        key = (str(file), f"{runtime}/{precision}")
        if key not in self.scores:
            out = self.files.folder / f"eval-{len(self.scores)}.json"
            self.files.folder.mkdir(parents=True, exist_ok=True)
            args = ["eval", str(file), "--data", self.data, "--json", str(out),
                    "--threads", str(self.threads), "--device", "cpu",
                    "--shapes-val", str(self.shapes_val)]
            if runtime != "torch":
                args += ["--runtime", runtime]
            if precision == "bf16":
                args += ["--precision", "bf16"]
            _irpe(args, f"irpe eval {file.name}")
            self.scores[key] = float(json.loads(out.read_text())["metrics"][self.metric])
        return self.scores[key]

    def reference(self, cand: Candidate) -> float:
        """fp32's score on the candidate's backend (torch: the weights; else the .onnx / IR on
        OpenVINO, as irpe serve runs it)."""
        runtime = "torch" if cand.backend == "torch" else "openvino"
        return self.score(self.files.path(cand.with_(precision="fp32")), runtime)

    def __call__(self, cand: Candidate) -> Tuple[bool, str]:
        if cand.backend == "torch":  # irpe eval runs trained weights in fp32 only
            return False, "the torch backend's bf16 has no irpe eval check; not gated in"
        try:
            ref = self.reference(cand)
            got = self.score(self.files.path(cand), "openvino", cand.precision)
        except RuntimeError as exc:
            return False, str(exc)
        ok = got >= ref - self.margin
        return ok, (f"{self.metric} {got:.2f} vs fp32 {ref:.2f} on {self.data}, margin "
                    f"{self.margin:g}")

