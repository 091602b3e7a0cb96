"""benchmarks.cpu_runtimes: the ratios and goals on synthetic timings, and one real --quick run
(ONNX Runtime and OpenVINO workers in their own processes) that writes its report."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from benchmarks import cpu_runtimes as cr
from tests.openvino_common import needs_openvino


def test_ratios_are_to_ort_plain_fp32_and_to_the_same_runtimes_plain():
    times = {"ort_plain_fp32": [0.2, 0.2], "ort_irpe_k_fp32": [0.25],
             "ov_plain_int8": [0.05], "ov_irpe_k_int8": [0.0625, 0.0625, 0.07]}
    rows = cr.summarize(times, batch=8)
    assert rows["ort_plain_fp32"]["images_per_s"] == pytest.approx(40.0)
    assert rows["ov_irpe_k_int8"]["x_ort_plain_fp32"] == pytest.approx(3.2)
    assert rows["ov_irpe_k_int8"]["x_same_plain"] == pytest.approx(0.8)
    assert rows["ort_irpe_k_fp32"]["x_same_plain"] == pytest.approx(0.8)
    judged = {(g["row"], g["reference"]): g for g in cr.goals(rows)}
    assert judged[("ov_irpe_k_int8", "ov_plain_int8")]["met"] is False  # 0.8 < 0.92
    assert judged[("ov_irpe_k_int8", "ort_plain_fp32")]["met"] is False  # 3.2 < 3.4
    assert judged[("ov_irpe_k_bf16", "ov_plain_bf16")]["ratio"] is None  # could not run
    lines = "\n".join(cr.report_lines({
        "device": "cpu-test", "date": "d", "model": "DeiT-S 224", "batch": 8, "threads": 2,
        "processes": 1, "rounds": 2, "onnxruntime": "x", "openvino": "y", "samples": 4,
        "load": "0", "results": rows, "goals": cr.goals(rows), "output_gap": {"m": 1e-6}}))
    assert "| ov_irpe_k_bf16 / ov_plain_bf16 >= 0.92 | could not run | - |" in lines
    assert "| m | 1e-06 |" in lines


def test_library_rows_judge_the_goals_and_compare_to_openvinos_own_plain():
    times = {"ov_plain_int8": [0.05], "ov_irpe_k_int8": [0.0625], "ov_irpe_k_int8_lib": [0.052],
             "ort_plain_fp32": [0.2], "ort_plain_fp32_lib": [0.1], "ort_irpe_k_fp32_lib": [0.2]}
    rows = cr.summarize(times, batch=8)
    assert rows["ov_irpe_k_int8_lib"]["x_same_plain"] == pytest.approx(0.05 / 0.052)
    assert rows["ort_irpe_k_fp32_lib"]["x_same_plain"] == pytest.approx(0.5)  # ORT's own lib
    judged = {(g["row"], g["reference"]): g for g in cr.goals(rows)}
    k = judged[("ov_irpe_k_int8_lib", "ov_plain_int8")]
    assert k["ratio"] == pytest.approx(0.05 / 0.052) and k["met"] is True
    assert ("ov_irpe_k_int8", "ov_plain_int8") not in judged


def test_output_gap_compares_the_same_model_on_both_runtimes(tmp_path):
    np.save(tmp_path / "ov_plain_fp32.npy", np.array([1.0, 2.0]))
    np.save(tmp_path / "ort_plain_fp32.npy", np.array([1.0, 2.5]))
    np.save(tmp_path / "ov_irpe_k_int8.npy", np.array([9.0]))  # int8 rows: not compared
    assert cr.output_gap(tmp_path) == {"plain_fp32": 0.5}


def test_bad_arguments_are_one_line(capsys):
    with pytest.raises(SystemExit) as err:
        cr.main(["--rounds", "0"])
    assert err.value.code == 2 and "must be >= 1" in capsys.readouterr().err


@needs_openvino
def test_quick_run_times_both_runtimes_in_their_own_processes(tmp_path, ov_library):
    env = dict(os.environ, IRPE_OV_OPS_LIBRARY=str(ov_library))
    out = subprocess.run([sys.executable, "-m", "benchmarks.cpu_runtimes", "--quick",
                          "--cache", str(tmp_path / "cache"), "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads((tmp_path / "cpu_runtimes_quick.json").read_text())
    rows = result["results"]
    for row in ("ort_plain_fp32", "ort_irpe_k_int8", "ov_plain_fp32", "ov_irpe_k_int8",
                "ov_irpe_qkv_fp32", "ov_irpe_k_fp32_lib", "ov_irpe_qkv_int8_lib"):
        assert rows[row]["images_per_s"] > 0, row
    assert "ov_plain_fp32_lib" not in rows  # no iRPE terms: OpenVINO's own attention
    assert set(result["output_gap"]) == {"plain_fp32", "irpe_k_fp32", "irpe_qkv_fp32",
                                         "irpe_k_fp32_lib", "irpe_qkv_fp32_lib"}
    assert max(result["output_gap"].values()) < 1e-4  # OpenVINO = ONNX Runtime in fp32
    assert "process 1/1 onnxruntime: done" in out.stdout
