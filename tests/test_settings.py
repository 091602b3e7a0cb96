"""The switches that change serving or export behaviour as typed settings (issue 30): the ONNX
Runtime options (irpe.runtime.onnxruntime.session.OrtOptions, read from the environment only by
``from_env``), serve's ``ort_*`` / ``fused_attention`` / ``decode_threads`` fields with their
sources and fallbacks, and one-line start-up errors for bad values. The env-var table:
test_env_table.py."""
from __future__ import annotations

import logging

import httpx
import numpy as np
import pytest
from onnx import TensorProto, helper

from irpe.artifact.contract import MIN_OPSET
from irpe.cli import main
from irpe.runtime.graph.rewrites import STAGES
from irpe.runtime.onnxruntime.session import OrtOptions, create_session
from serve.config import ModelConfig, ServeSettings
from tests.helpers import export_tiny_qkv, running_server, shape_png

ALL = frozenset(STAGES)


def _identity() -> bytes:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", MIN_OPSET)])
    return model.SerializeToString()


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("IRPE_ORT_CUSTOM_OPS", "IRPE_ORT_OPS_LIBRARY", "IRPE_ORT_FUSE",
                 "IRPE_FUSED_ATTENTION", "IRPE_SERVE_ORT_CUSTOM_OPS", "IRPE_SERVE_ORT_REWRITES",
                 "IRPE_SERVE_ORT_OPS_LIBRARY", "IRPE_SERVE_FUSED_ATTENTION",
                 "IRPE_SERVE_DECODE_THREADS"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_ort_options_from_env_checked_and_named(clean_env, tmp_path):
    assert OrtOptions.from_env() == OrtOptions() == OrtOptions("auto", None, ALL)
    clean_env.setenv("IRPE_ORT_CUSTOM_OPS", "0")
    clean_env.setenv("IRPE_ORT_OPS_LIBRARY", str(tmp_path / "x.so"))
    clean_env.setenv("IRPE_ORT_FUSE", " Softmax,gather ")
    got = OrtOptions.from_env()
    assert got == OrtOptions("off", tmp_path / "x.so", frozenset({"gather", "softmax"}))
    assert got.with_(custom_ops="on", rewrites="0") == OrtOptions("on", tmp_path / "x.so",
                                                                  frozenset())
    assert got.with_() == got  # None replaces nothing
    for name, bad, message in (("IRPE_ORT_FUSE", "sofmax", "unknown rewrite stage sofmax"),
                               ("IRPE_ORT_CUSTOM_OPS", "sometimes", "custom-ops mode must be")):
        clean_env.setenv(name, bad)
        with pytest.raises(ValueError, match=f"{name}='{bad}': {message}"):
            OrtOptions.from_env()
        clean_env.delenv(name)
    with pytest.raises(ValueError, match="unknown rewrite stage nope"):
        OrtOptions(rewrites=["gather", "nope"])


def test_create_session_reads_no_environment(clean_env, tmp_path):
    """Variables that would make the session fail are ignored by create_session: only the
    options passed count (an entry point reads them once, with from_env)."""
    clean_env.setenv("IRPE_ORT_CUSTOM_OPS", "on")
    clean_env.setenv("IRPE_ORT_OPS_LIBRARY", str(tmp_path / "missing.so"))
    session, _ = create_session(_identity(), quiet=True)
    x = np.array([1.0, 2.0], np.float32)
    assert np.array_equal(session.run(None, {"x": x})[0], x)
    from irpe.runtime.onnxruntime.session import CustomOpsError
    with pytest.raises(CustomOpsError, match="missing.so"):
        create_session(_identity(), options=OrtOptions.from_env(), quiet=True)


def test_serve_ort_settings_sources_and_model_overrides(clean_env, tmp_path):
    """File < old variable < IRPE_SERVE_* variable < argument; a model's own value wins over
    the server's and every model leaves validation complete."""
    repo = tmp_path / "models.yaml"
    repo.write_text("ort_rewrites: gather,scatter\nort_ops_library: lib/ops.so\n"
                    "models:\n  - {name: a, path: a.onnx, backend: onnxruntime}\n"
                    "  - {name: b, path: b.onnx, backend: onnxruntime, ort_custom_ops: 'off',"
                    " ort_rewrites: '0', ort_ops_library: own.so}\n")
    s = ServeSettings(repository=repo)
    assert (s.ort_custom_ops, s.ort_rewrites, s.ort_ops_library) == (
        "auto", "gather,scatter", tmp_path / "lib" / "ops.so")
    a, b = s.models
    assert (a.ort_custom_ops, a.ort_rewrites, a.ort_ops_library) == (
        "auto", "gather,scatter", tmp_path / "lib" / "ops.so")
    assert (b.ort_custom_ops, b.ort_rewrites, b.ort_ops_library) == ("off", "0",
                                                                     tmp_path / "own.so")
    clean_env.setenv("IRPE_ORT_FUSE", "softmax,qlayout")
    clean_env.setenv("IRPE_ORT_CUSTOM_OPS", "yes")
    clean_env.setenv("IRPE_FUSED_ATTENTION", "0")
    s = ServeSettings(repository=repo)
    assert (s.ort_rewrites, s.ort_custom_ops, s.fused_attention) == ("qlayout,softmax", "on",
                                                                     "off")
    assert s.models[0].ort_rewrites == "qlayout,softmax" and s.models[1].ort_rewrites == "0"
    clean_env.setenv("IRPE_SERVE_ORT_REWRITES", "attention")
    clean_env.setenv("IRPE_SERVE_DECODE_THREADS", "3")
    s = ServeSettings(repository=repo)
    assert (s.ort_rewrites, s.decode_threads) == ("attention", 3)
    assert ServeSettings(repository=repo, ort_rewrites="1").ort_rewrites == ",".join(STAGES)
    demo = ModelConfig(name="c", path=tmp_path / "c.onnx", backend="onnxruntime")
    assert s.with_models(s.models + [demo]).models[2].ort_rewrites == "attention"


def test_switches_take_one_vocabulary_and_the_older_spellings(clean_env, tmp_path):
    """auto/on/off (docs/settings.md): YAML's unquoted on/off (booleans to YAML) read as on/off;
    the older spellings of irpe.switch.SWITCH_ALIASES still accepted, stored as on/off."""
    repo = tmp_path / "models.yaml"
    repo.write_text("fused_attention: off\nort_custom_ops: on\nmodels:\n"
                    "  - {name: a, path: a.onnx, backend: onnxruntime, ort_custom_ops: no}\n")
    s = ServeSettings(repository=repo)
    assert (s.fused_attention, s.ort_custom_ops, s.models[0].ort_custom_ops) == ("off", "on",
                                                                                 "off")
    for old, new in (("fused", "on"), ("UNFUSED", "off"), ("true", "on"), ("0", "off")):
        assert ServeSettings(fused_attention=old, ort_custom_ops=old).fused_attention == new
        assert ServeSettings(ort_custom_ops=old).ort_custom_ops == new


@pytest.mark.parametrize("env,message", [
    ({"IRPE_ORT_FUSE": "sofmax"}, "ort_rewrites: Value error, unknown rewrite stage sofmax"),
    ({"IRPE_SERVE_ORT_CUSTOM_OPS": "sometimes"}, "ort_custom_ops: Input should be 'auto'"),
    ({"IRPE_FUSED_ATTENTION": "fast"}, "fused_attention: Input should be 'auto'"),
    ({"IRPE_SERVE_DECODE_THREADS": "-1"}, "decode_threads: Input should be greater than or"),
    ({"REPO": "models: [{name: m, path: m.onnx, backend: onnxruntime, ort_rewrites: x}]"},
     "models.0.ort_rewrites: Value error, unknown rewrite stage x"),
])
def test_bad_setting_stops_irpe_serve_with_one_line(clean_env, tmp_path, capsys, env, message):
    repo = tmp_path / "models.yaml"
    repo.write_text(env.pop("REPO", "models: []") + "\n")
    for name, value in env.items():
        clean_env.setenv(name, value)
    assert main(["serve", str(repo), "--prepare"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"irpe serve: error: invalid settings: {message}"), err
    assert len(err.splitlines()) == 1


def test_bad_rewrites_stop_irpe_validate_with_one_line(clean_env, tmp_path, capsys):
    missing = str(tmp_path / "m.onnx")  # checked after the settings: they fail first
    assert main(["validate", missing, "--runtime", "onnxruntime", "--rewrites",
                 "gather,sofmax"]) == 2
    clean_env.setenv("IRPE_ORT_FUSE", "sofmax")
    assert main(["validate", missing]) == 2
    flag, env = capsys.readouterr().err.strip().splitlines()
    assert flag == ("irpe validate: error: unknown rewrite stage sofmax (0, 1 or a comma list "
                    "of qlayout, gather, scatter, softmax, attention)")
    assert env.startswith("irpe validate: error: IRPE_ORT_FUSE='sofmax': unknown rewrite stage")


def test_server_runs_its_models_as_its_ort_settings_say(ort_library, clean_env, tmp_path,
                                                        caplog):
    """A real server: the library from the setting, the server's rewrites (here from the old
    IRPE_ORT_FUSE=0: none) for one model and a model's own (1: all) for the other; both
    answer /v1/classify alike."""
    _, _, onnx_path, _ = export_tiny_qkv(tmp_path)
    clean_env.setenv("IRPE_ORT_FUSE", "0")
    settings = ServeSettings(threads=1, log_level="warning", ort_ops_library=ort_library,
                             models=[{"name": "plain", "path": onnx_path,
                                      "backend": "onnxruntime", "ort_custom_ops": "on"},
                                     {"name": "blocks", "path": onnx_path,
                                      "backend": "onnxruntime", "ort_rewrites": "1"}])
    with caplog.at_level(logging.INFO, logger="irpe.serve"), running_server(settings) as url:
        with httpx.Client(base_url=url, timeout=30) as client:
            got = {name: client.post(f"/v1/models/{name}/classify",
                                     files=[("image", ("x.png", shape_png(1)))])
                   for name in ("plain", "blocks")}
    ops = {r.model: r.irpe_ops for r in caplog.records if hasattr(r, "irpe_ops")}
    assert ops["plain"] == f"iRPE ops: custom-op library {ort_library}"
    assert ops["blocks"] == (f"iRPE ops: custom-op library {ort_library} (4 gather+Add, "
                             "2 scatter+MatMul+Add, 2 Softmax, 2 attention blocks fused) "
                             "(2 Q tables bucket-major)")
    assert all(r.status_code == 200 for r in got.values()), {n: r.text for n, r in got.items()}
    plain, blocks = (got[n].json()["results"][0] for n in ("plain", "blocks"))
    assert plain["indices"] == blocks["indices"]
    assert np.allclose(plain["scores"], blocks["scores"], atol=1e-4)


def test_fused_attention_setting_applies_at_app_start(clean_env, files):
    from irpe.fused import fused_mode, set_fused_attention
    from serve.app import create_app
    models = [{"name": "m", "path": files["cls"]}]
    try:
        create_app(ServeSettings(fused_attention="off", models=models))
        assert fused_mode() == "off"
        create_app(ServeSettings(models=models))  # not set: the process's mode stays
        assert fused_mode() == "off"
    finally:
        set_fused_attention(None)


@pytest.mark.parametrize("flags", [["--prepare"], ["--ray-config", "-"], ["--ray"]])
@pytest.mark.parametrize("variable, value, message", [
    ("IRPE_SERVE_MODELS", '[{"name": "m",', "IRPE_SERVE_MODELS='[{\"name\": \"m\",' is not JSON"),
    ("IRPE_SERVE_RAY", "{num_cpus: 1}", "IRPE_SERVE_RAY='{num_cpus: 1}' is not JSON"),
    ("IRPE_SERVE_CORS_ORIGINS", "[https://a", "cors_origins: Value error, not a JSON list"),
    ("IRPE_SERVE_RAY", '{"num_cpus": 0}', "ray.num_cpus: Input should be greater than 0"),
])
def test_bad_json_from_the_environment_is_one_line_naming_it(clean_env, tmp_path, flags,
                                                             variable, value, message):
    """Issue 50, defect 4: a variable that is not JSON (or not valid) is one line naming it,
    exit 2, in a real `irpe serve` process, before anything starts (--ray: before Ray)."""
    import subprocess
    import sys

    from tests.helpers import ROOT
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("IRPE_SERVE")}
    run = subprocess.run([sys.executable, "-m", "irpe", "serve", "--port", "0", *flags],
                         cwd=ROOT, env={**env, variable: value}, capture_output=True, text=True,
                         timeout=120)
    err = run.stderr.strip()
    assert run.returncode == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("irpe serve: error: invalid settings: ") and message in err, err
    assert variable in err


def test_cors_origins_take_a_comma_list_or_json(clean_env):
    """IRPE_SERVE_CORS_ORIGINS as users write it (a comma list), or as a JSON list."""
    clean_env.setenv("IRPE_SERVE_CORS_ORIGINS", "https://a.example, https://b.example")
    assert ServeSettings().cors_origins == ["https://a.example", "https://b.example"]
    clean_env.setenv("IRPE_SERVE_CORS_ORIGINS", '["https://c.example"]')
    assert ServeSettings().cors_origins == ["https://c.example"]
