"""Facts that live in one place: method ids (Python table vs the C/C++ tables), registered model
names (spelled out in the source), what the wheel ships and how a name clash shows."""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import irpe
from irpe.bucket import METHOD_IDS, Method, parse_method
from irpe.models import list_models
from irpe.models.deit import _deit_config

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = ROOT / "plugins"


def _header_ids() -> dict:
    text = (PLUGINS / "kernels" / "irpe_bucket.h").read_text()
    return {name: int(v) for name, v in re.findall(r"IRPE_METHOD_(\w+) = (\d+)", text)}


def test_the_c_method_name_table_agrees_with_python():
    """The one {"name", IRPE_METHOD_X} table (kernels/irpe_methods.h) maps the names irpe.bucket
    parses to the ids irpe.bucket assigns."""
    header = _header_ids()
    text = (PLUGINS / "kernels" / "irpe_methods.h").read_text()
    pairs = re.findall(r'\{\s*"(\w+)",\s*IRPE_METHOD_(\w+)\s*\}', text)
    assert pairs, "no method table found in irpe_methods.h"
    single_maps = {m.value for m in METHOD_IDS if m is not Method.CROSS}
    assert sorted(name for name, _ in pairs) == sorted(single_maps)
    for name, macro in pairs:
        assert header[macro] == METHOD_IDS[parse_method(name)], (name, macro)


@pytest.mark.parametrize("source", ["tensorrt/rpe_fields.cpp", "onnxruntime/rpe_config.cpp"])
def test_plugins_look_method_names_up_in_the_one_table(source):
    """The TensorRT plugin and the ORT ops read method names through irpe_method_id."""
    text = (PLUGINS / source).read_text()
    assert '#include "irpe_methods.h"' in text and "irpe_method_id(" in text


def test_no_other_c_source_keeps_a_method_name_table():
    sources = [p for p in PLUGINS.rglob("*") if p.suffix in (".c", ".cc", ".cpp", ".cu", ".h")]
    tables = [str(p.relative_to(PLUGINS)) for p in sources
              if re.search(r'"\w+",\s*IRPE_METHOD_', p.read_text())]
    assert tables == ["kernels/irpe_methods.h"]


def test_the_config_of_an_irpe_node_has_one_name():
    """irpe.rpe.RPEConfig's C++ counterparts (a TensorRT plugin's fields, an ONNX Runtime node's
    attributes) are RPEConfig too, whatever else differs between them."""
    sources = [p for p in PLUGINS.rglob("*") if p.suffix in (".h", ".cpp", ".cu")
               and "third_party" not in p.parts]
    structs = {str(p.relative_to(PLUGINS)) for p in sources
               if re.search(r"\bstruct\s+RPEConfig\b", p.read_text())}
    assert structs == {"tensorrt/rpe_plugin.h", "onnxruntime/rpe_ort.h"}
    assert not [p for p in sources if re.search(r"\bRpeConfig\b", p.read_text())]


def test_official_numeric_ids_parse():
    assert {parse_method(v) for v in METHOD_IDS.values()} == set(Method)
    with pytest.raises(ValueError, match="unknown iRPE method 2"):
        parse_method(2)


def test_every_registered_model_name_is_spelled_out_in_the_source():
    """`grep -rn NAME irpe/models` finds every published name (no names built in loops)."""
    source = "\n".join(p.read_text() for p in (ROOT / "irpe" / "models").glob("*.py"))
    missing = [n for n in list_models() if f'"{n}"' not in source]
    assert missing == []
    assert len(list_models("deit_*_patch16_224*")) == 15 and len(list_models("detr_*")) == 4


@pytest.mark.parametrize("name", ["deit_huge_patch16_224", "deit_tiny_patch16_224_ctx_foo",
                                  "vit_tiny_patch16_224"])
def test_deit_names_outside_the_scheme_are_refused(name):
    with pytest.raises(ValueError, match="not a DeiT model name"):
        _deit_config(name)


def _tracked_copy(dest: Path) -> Path:
    """The checkout's tracked files (working-tree contents) copied to ``dest``."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                                check=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError) as exc:
        if os.environ.get("CI") == "true":
            raise
        pytest.skip(f"not a git checkout: {exc}")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


def test_wheel_ships_irpe_export_serve_and_not_benchmarks(tmp_path):
    """`pip wheel .` (no build isolation: the installed setuptools) lists only the product, under
    irpe.__version__ (pyproject.toml reads it: dynamic)."""
    if importlib.util.find_spec("setuptools") is None and os.environ.get("CI") != "true":
        pytest.skip("setuptools is not installed (pip install setuptools)")
    src = _tracked_copy(tmp_path / "src")
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "-q",
                    "--no-build-isolation", "-w", str(tmp_path / "dist")], check=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("irpe_deploy-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    assert f"\nVersion: {irpe.__version__}\n" in zipfile.ZipFile(wheel).read(metadata).decode()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"irpe", "export", "serve"}
    for shipped in ("irpe/demo/deit_shapes_irpe.safetensors", "irpe/artifact/contract.py",
                    "export/onnx.py", "serve/app.py"):
        assert shipped in names


def test_the_version_is_written_once():
    """pyproject.toml takes the version from irpe/__init__.py (read without importing irpe, so
    a wheel, an editable install and a checkout agree)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "irpe.__version__"}
    assert re.search(r'^__version__ = "[^"]+"', (ROOT / "irpe" / "__init__.py").read_text(), re.M)


def test_a_foreign_serve_package_is_reported_not_silently_dropped(tmp_path):
    """Another distribution's top-level `serve` first on sys.path: `irpe` says so (exit 2)."""
    (tmp_path / "serve").mkdir()
    (tmp_path / "serve" / "__init__.py").write_text("# another project's serve\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    run = subprocess.run([sys.executable, "-c", "import sys; from irpe.cli import main; "
                          "sys.exit(main(['serve', '--help']))"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert f"irpe: warning: {tmp_path / 'serve'} hides irpe-deploy's package" in run.stderr
    assert "invalid choice: 'serve'" in run.stderr
