"""The installed ``irpe`` console script, run as a user would."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

IRPE = Path(sys.executable).with_name("irpe")
CMD = [str(IRPE)] if IRPE.exists() else [sys.executable, "-m", "irpe"]


def run(*args, timeout=300):
    env = dict(os.environ, OMP_NUM_THREADS="2")
    return subprocess.run(CMD + list(args), capture_output=True, text=True, timeout=timeout,
                          env=env)


def test_help_everywhere():
    for args in [("--help",), ("models", "--help"), ("info", "--help"), ("check", "--help")]:
        out = run(*args)
        assert out.returncode == 0 and "usage: irpe" in out.stdout


def test_models_lists_params_and_macs():
    out = run("models", "deit_small*")
    assert out.returncode == 0, out.stderr
    lines = {line.split()[0]: line.split() for line in out.stdout.splitlines()[1:]}
    assert len(lines) == 8
    plain = lines["deit_small_patch16_224"]
    qkv = lines["deit_small_patch16_224_ctx_product_50_shared_qkv"]
    assert plain[1:3] == ["22.05M", "4.60G"]  # DeiT-S: 22M params, 4.6 GMACs
    assert float(qkv[1][:-1]) > float(plain[1][:-1])
    assert qkv[3:5] == ["224x224", "rpe-1.9-product-ctx-1-qkv"]


def test_info_prints_bucket_table_and_counts():
    out = run("info", "deit_small_patch16_224_ctx_product_50_shared_k")
    assert out.returncode == 0, out.stderr
    assert "50 buckets allocated, 50 used" in out.stdout
    assert "bucket       0   1   2   2   3" in out.stdout
    grid = out.stdout.strip().splitlines()[-14:]
    assert grid[7].split()[7] == "24"  # the query's own position: (0+3)*7 + (0+3)
    out = run("info", "deit_small_patch16_224_ctx_quant_51_shared_k", "--height", "5",
              "--width", "9")
    assert "grid 5x9 + 1 skip token(s): 134 buckets allocated" in out.stdout


def test_check_passes():
    out = run("check", "--batch", "1")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "6 passed, 0 failed" in out.stdout and "FAIL" not in out.stdout


@pytest.mark.parametrize("args,message", [
    (("info", "deit_nope"), "unknown model 'deit_nope'"),
    (("models", "zzz*"), "no model matches"),
    (("check", "--model", "nope"), "unknown model"),
    (("info", "deit_tiny_patch16_224", "--height", "0"), "must be >= 1"),
    (("frobnicate",), "invalid choice"),
])
def test_bad_input_is_one_line_and_nonzero(args, message):
    out = run(*args)
    assert out.returncode == 2
    assert message in out.stderr
    assert "Traceback" not in out.stderr
