"""benchmarks.quant_ort's ratios and goal verdicts from per-round times (no timing here: the
numbers are given, the arithmetic and the report are checked)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks.quant_ort import agreement, goals, summarize, write_report

TIMES = {"plain": [1.0, 2.0, 1.0], "plain_int8_ops": [0.5, 1.0, 0.5],
         "irpe_k_int8_ops": [0.4, 0.8, 0.5], "irpe_qkv_int8_ops": [0.6, 1.0, 0.6]}
MODELS = {k: "deit_small" for k in TIMES}


def test_ratios_against_plain_fp32_and_plain_int8_of_the_same_path():
    rows = summarize(TIMES, MODELS, batch=8)
    assert rows["irpe_k_int8_ops"]["x_plain_fp32"] == 1.0 / 0.5  # medians 1.0 and 0.5
    assert rows["irpe_k_int8_ops"]["x_plain_int8"] == 0.5 / 0.5
    assert rows["irpe_qkv_int8_ops"]["x_plain_int8"] == 0.5 / 0.6
    assert rows["plain"]["x_plain_int8"] is None  # no stock plain int8 row in this run
    assert rows["irpe_k_int8_ops"]["images_per_s"] == 8 / 0.5


def test_goal_verdicts():
    verdicts = {(g["row"], g["reference"]): g for g in goals(TIMES)}
    assert not verdicts[("irpe_k_int8_ops", "plain")]["met"]  # 2.0 < 2.5
    assert verdicts[("irpe_k_int8_ops", "plain_int8_ops")]["met"]  # 1.0 >= 0.95
    assert not verdicts[("irpe_qkv_int8_ops", "plain_int8_ops")]["met"]  # 0.83 < 0.90
    assert verdicts[("irpe_k_int8_ops", "plain")]["ratio_round_median"] == 2.5


def test_agreement_and_report(tmp_path: Path):
    ref = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    logits = {"plain": ref, "plain_int8": np.array([[0.9, 0.1], [0.6, 0.4]], np.float32)}
    a = agreement(logits)["plain_int8"]
    assert a["top1_agreement"] == 0.5 and abs(a["max_abs"] - 0.6) < 1e-6
    result = {"device": "cpu-test", "batch": 8, "threads": 2, "onnxruntime": "x", "mode": "static",
              "samples": 16, "repeats": 3, "sessions": 1, "load_before": "1", "load_after": "2",
              "uptime": "up", "uptime_after": "up2", "results": summarize(TIMES, MODELS, 8),
              "fusion": {k: "path" for k in TIMES}, "goals": goals(TIMES),
              "agreement": {"plain_int8": a}}
    text = write_report(result, tmp_path).read_text()
    assert "| irpe_k_int8_ops / plain >= 2.50 | 2.000 | 2.500 | missed |" in text
    assert "(uptime before: up; after: up2)" in text
