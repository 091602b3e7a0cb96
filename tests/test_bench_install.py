"""`irpe bench` where `irpe` is (issue 27): the console script of an editable install (what
`make install` makes) finds the checkout's benchmarks package; an install without the checkout
says where `irpe bench` lives; without matplotlib a benchmark still writes its JSON and Markdown
and exits 0 (plots are optional)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv

from tests.helpers import BLOCKER, ROOT


def test_console_script_of_an_editable_install_runs_bench(tmp_path):
    """A fresh venv (its packages: this interpreter's, through a .pth) with the checkout
    installed editable, as `make install` does; its bin/irpe runs from another directory."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                              "['purelib'])"], capture_output=True, text=True, check=True)
    with open(os.path.join(purelib.stdout.strip(), "outer.pth"), "w") as pth:
        pth.write(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", "-e", str(ROOT)], check=True, env=env,
                   capture_output=True, timeout=300)
    out = tmp_path / "results"
    done = subprocess.run([str(env_dir / "bin" / "irpe"), "bench", "attention", "--smoke",
                           "--out", str(out)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads((out / "bench_attention.json").read_text())
    assert doc["kind"] == "attention" and doc["results"]


def test_bench_without_the_checkout_says_where_it_lives(tmp_path):
    """A wheel's layout (irpe, export, serve side by side; no benchmarks/, no pyproject.toml):
    `irpe bench ...` is one line naming the way to run it and exit status 2, not argparse's
    "invalid choice"."""
    site = tmp_path / "site"
    for package in ("irpe", "export", "serve"):
        shutil.copytree(ROOT / package, site / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    env = dict(os.environ, PYTHONPATH=str(site))
    done = subprocess.run([sys.executable, "-m", "irpe", "bench", "ops", "--quick"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        "irpe bench: error: benchmarks/ is part of the repository checkout, not of this "
        "installed package: run `irpe bench` from a checkout (`make install`, then "
        "`.venv/bin/irpe bench`, or `python -m irpe bench` in it)"]
    assert not (tmp_path / "benchmarks").exists()


def test_bench_without_matplotlib_writes_reports_and_exits_0(tmp_path):
    from benchmarks.report import envelope
    doc = envelope("models", {"device": "cpu"}, [], ["no rows: the report plumbing"])
    (tmp_path / "bench_models.json").write_text(json.dumps(doc))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([BLOCKER, str(ROOT)]),
               IRPE_TEST_BLOCKED="matplotlib")
    done = subprocess.run([sys.executable, "-m", "irpe", "bench", "report", "--out",
                           str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "matplotlib is not installed" in done.stderr
    assert (tmp_path / "bench_models.md").is_file() and not list(tmp_path.glob("*.png"))
