"""``irpe export``, ``irpe validate`` and ``irpe build-engine`` (registered by irpe.cli).

Heavy modules (onnx, onnxruntime, tensorrt) are imported inside the command functions.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from pathlib import Path
from typing import List, Optional, TextIO, Tuple

from irpe.artifact.contract import DEFAULT_OPSET, MAX_OPSET, MIN_OPSET
from irpe.errors import CLIError
from irpe.outputs import check_outputs
from irpe.switch import SWITCHES

__all__ = ["add_parser", "cmd_export", "cmd_validate", "cmd_build_engine"]


def cmd_export(args: argparse.Namespace) -> int:
    """Export a model to ONNX; prints the output path, size and RPE node counts."""

    from .onnx import export_onnx
    output = _output(args.source, args.output)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = _warn_line
        export_onnx(args.source, output, args.checkpoint, inline=args.inline, opset=args.opset,
                    progress=not args.quiet, optimize=not args.no_optimize, summary=sys.stdout)
    return 0


def _warn_line(message: Warning | str, category: type[Warning], filename: str, lineno: int,
               file: Optional[TextIO] = None, line: Optional[str] = None) -> None:
    print(f"warning: {message}", file=sys.stderr)


def _default_output(source: str) -> str:
    return Path(source).stem + ".onnx"


def _output(source: str, output: Optional[str]) -> str:
    """``-o``: a file, or an existing folder to write ``<source>.onnx`` into (default: here)."""
    if output and os.path.isdir(output):
        return os.path.join(output, _default_output(source))
    return output or _default_output(source)


def cmd_validate(args: argparse.Namespace) -> int:
    """Compare the file with PyTorch; exit status 1 when any output is out of tolerance."""
    from irpe.runtime.onnxruntime.session import CustomOpsError, OrtOptions
    from irpe.runtime.openvino.session import OvOptions

    from .validate import validate, write_report
    _check_runtime_flags(args)
    ort_options = OrtOptions.from_env().with_(args.custom_ops, args.ops_library, args.rewrites)
    ov_options = OvOptions.from_env()
    if args.json:
        check_outputs([args.json], [args.file, args.checkpoint, args.ops_library, args.images,
                                    args.source if args.source and os.path.isfile(args.source)
                                    else None])
    try:
        report = validate(args.file, args.source, args.checkpoint, num_inputs=args.num_inputs,
                          image_dir=args.images, atol=args.atol, rtol=args.rtol,
                          precision=args.precision, sizes=args.sizes, ort_options=ort_options,
                          runtime=args.runtime, ov_options=ov_options)
    except CustomOpsError as exc:
        raise CLIError(str(exc)) from None
    if args.json:
        write_report(report, args.json)
    _print_report(report)
    return 0 if report["passed"] else 1


def _check_runtime_flags(args: argparse.Namespace) -> None:
    """ONNX Runtime's flags name the runtime they need: given for a file that runs on another
    (irpe.runtime.pick), a usage error of one line rather than flags silently unused."""
    from irpe.runtime.pick import pick_runtime
    given = [flag for flag, value in (("--custom-ops", args.custom_ops),
                                      ("--ops-library", args.ops_library),
                                      ("--rewrites", args.rewrites)) if value is not None]
    runtime = pick_runtime(args.file, "cpu", args.runtime)
    if given and runtime != "onnxruntime":
        raise CLIError(f"{', '.join(given)}: ONNX Runtime's options, but {args.file} runs on "
                       f"{runtime}; add --runtime onnxruntime to validate it there")


def _print_report(report: dict) -> None:
    print(f"{report['file']}: {report['model']} on {report['runtime']}, {report['num_inputs']} "
          f"inputs, {report['precision']} (atol {report['atol']:g}, rtol {report['rtol']:g})")
    print(f"  {'output':<12} {'max abs':>10} {'mean abs':>10} {'max rel':>10} {'cosine':>10} "
          f"{'violations':>12}")
    for name, row in report["outputs"].items():
        if "shape_mismatch" in row:
            print(f"  {name:<12} shape mismatch: got {row['shape_mismatch'][0]}, "
                  f"expected {row['shape_mismatch'][1]}")
            continue
        print(f"  {name:<12} {row['max_abs']:10.3g} {row['mean_abs']:10.3g} "
              f"{row['max_rel']:10.3g} {row['cosine']:10.7f} "
              f"{row['violations']:>5}/{row['elements']:<6}")
    print("  " + ", ".join(f"{k} {v:.4g}" for k, v in report["metrics"].items()))
    if report.get("custom_ops_vs_functions"):
        print("  custom ops vs functions, max abs: " + ", ".join(
            f"{k} {v:.3g}" for k, v in report["custom_ops_vs_functions"].items()))
    if report["passed"]:
        print("PASS")
        return
    worst = [f"{line}" for line in report.get("failed_metrics", [])]
    for name in report["failed_outputs"]:
        w = report["outputs"][name].get("worst", {})
        worst.append(f"{name} (input {w.get('input')}, index {w.get('index')}: got "
                     f"{w.get('got')}, expected {w.get('expected')})" if w else name)
    print("FAIL: " + ("worst outputs: " if report["failed_outputs"] else "") + "; ".join(worst))


def cmd_build_engine(args: argparse.Namespace) -> int:
    """Build a TensorRT engine (and its .json sidecar) from an ONNX file."""
    from irpe.runtime.tensorrt.build import build_engine
    from irpe.runtime.tensorrt.common import EngineBuildError, TensorRTUnavailable
    output = args.output or str(args.onnx).rsplit(".", 1)[0] + ".engine"
    # the engine and its sidecar (whatever the engine's name), the timing cache (read, then
    # replaced: its own input, not another's)
    from irpe.artifact.contract import sidecar_path
    check_outputs([output, sidecar_path(output), args.timing_cache], [args.onnx, *args.plugin])
    try:
        side = build_engine(args.onnx, output, precision=args.precision, batch=args.batch,
                            height=args.height, width=args.width,
                            workspace_mib=args.workspace_mib, timing_cache=args.timing_cache,
                            plugins=args.plugin, plugin_override=args.plugin_override,
                            compute_capability=args.compute_capability, progress=True)
    except TensorRTUnavailable as exc:
        raise CLIError(str(exc)) from None
    except EngineBuildError as exc:  # the build itself failed (or its isolated process died)
        print(f"irpe build-engine: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    print(f"wrote {output} ({side['tensorrt_module']} {side['tensorrt_version']}, "
          f"{side['precision']}, {side['compute_capability']}, rpe: {side['rpe_nodes']})")
    print("profiles: " + json.dumps(side["profiles"]))
    return 0


def _range3(text: str) -> Tuple[int, int, int]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN,OPT,MAX integers, got {text!r}") from None
    if len(values) == 1:
        values = values * 3
    if len(values) != 3:
        raise argparse.ArgumentTypeError(f"expected MIN,OPT,MAX (or one value), got {text!r}")
    return values


def _sizes(text: str) -> List[Tuple[int, int]]:
    out = []
    for item in text.split(","):
        try:
            h, w = (int(v) for v in item.lower().split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"sizes are HxW[,HxW...], got {text!r}") from None
        if h < 1 or w < 1:
            raise argparse.ArgumentTypeError(f"sizes must be positive, got {item!r}")
        out.append((h, w))
    return out


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register export, validate, build-engine, quantize and triton-repo on ``irpe``."""
    p = sub.add_parser("export", help="export a model to ONNX (RPE nodes + local functions)")
    p.add_argument("source", help="registered model name or trained-model .safetensors file")
    p.add_argument("-o", "--output", help="ONNX file to write (default: ./<source>.onnx)")
    p.add_argument("--checkpoint", help="weights for a registered name (.pth / .safetensors)")
    p.add_argument("--inline", action="store_true",
                   help="inline the RPE functions: plain ONNX without irpe-domain nodes")
    p.add_argument("--opset", type=int, default=DEFAULT_OPSET,
                   help=f"ONNX opset, {MIN_OPSET}..{MAX_OPSET} (default {DEFAULT_OPSET})")
    p.add_argument("--no-optimize", action="store_true", help="skip constant folding/pruning")
    p.add_argument("-q", "--quiet", action="store_true", help="no per-step timing on stderr")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("validate", help="compare an ONNX file, IR or engine with PyTorch")
    p.add_argument("file", help=".onnx file, OpenVINO IR .xml, or .engine/.plan (TensorRT, "
                   "needs a GPU)")
    p.add_argument("--runtime", choices=["auto", "onnxruntime", "openvino", "tensorrt"],
                   help="what runs the file (default auto: the runtime irpe serve and irpe eval "
                        "run it on: an .onnx on openvino on the CPU where installed, else "
                        "onnxruntime; an IR on openvino; an engine on tensorrt)")
    p.add_argument("--source", help="model name / trained-model file (default: from metadata)")
    p.add_argument("--checkpoint", help="weights for --source or the file's model name")
    p.add_argument("-n", "--num-inputs", type=int, default=8, help="inputs in total")
    p.add_argument("--images", help="folder of real images used first (subfolders too, sorted)")
    p.add_argument("--precision", choices=["fp32", "tf32", "fp16", "bf16", "int8"],
                   help="tolerances to judge by (default: int8 for a quantised file, else "
                        "fp32); bf16: --runtime openvino compiles in bf16 (a CPU with BF16)")
    p.add_argument("--atol", type=float, help="absolute tolerance (default per precision)")
    p.add_argument("--rtol", type=float, help="relative tolerance (default per precision)")
    p.add_argument("--sizes", type=_sizes, help="detection input sizes, e.g. 480x640,640x480")
    p.add_argument("--json", help="write the full report to this JSON file")
    p.add_argument("--custom-ops", choices=SWITCHES, default=None,
                   help="ONNX Runtime iRPE custom-op library (plugins/onnxruntime): auto (default, "
                        "$IRPE_ORT_CUSTOM_OPS), on (required) or off (the file's functions)")
    p.add_argument("--ops-library", metavar="FILE", help="the custom-op library file (default "
                   "$IRPE_ORT_OPS_LIBRARY, else build/plugins/libirpe_ort_ops.so)")
    p.add_argument("--rewrites", metavar="STAGES", help="load-time graph rewrites with the "
                   "library: 1 (all), 0 (none) or a comma list of qlayout, gather, scatter, "
                   "softmax, attention (default $IRPE_ORT_FUSE, else 1)")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("build-engine", help="ONNX -> TensorRT engine (tensorrt or TensorRT-RTX)")
    p.add_argument("onnx", help="ONNX file from `irpe export`")
    p.add_argument("-o", "--output", help="engine file (default: <onnx>.engine)")
    p.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "fp16"])
    p.add_argument("--batch", type=_range3,
                   help="MIN,OPT,MAX batch (default 1,8,32; detection 1,2,8)")
    p.add_argument("--height", type=_range3,
                   help="MIN,OPT,MAX input height (detection; default 32,min_size,max_size)")
    p.add_argument("--width", type=_range3, help="MIN,OPT,MAX input width (detection)")
    p.add_argument("--workspace-mib", type=int, help="builder workspace limit in MiB")
    p.add_argument("--timing-cache", help="timing cache file (read if present, then updated)")
    p.add_argument("--plugin", action="append", default=[],
                   help="plugin library to load (repeatable), e.g. "
                        "build/plugins/libirpe_trt_plugins.so; the build then runs in a child "
                        "process (TensorRT-RTX: with a libtensorrt_rtx.so link on its library "
                        "path)")
    p.add_argument("--plugin-override", action="store_true",
                   help="set the parser flag ENABLE_PLUGIN_OVERRIDE")
    p.add_argument("--compute-capability",
                   help="TensorRT-RTX ahead-of-time target, e.g. SM89 (default: this GPU)")
    p.set_defaults(func=cmd_build_engine)

    from .quantize_cli import add_parser as add_quantize
    add_quantize(sub)  # irpe quantize (export/quantize_cli.py)
    from .triton_repo_cli import add_parser as add_triton_repo
    add_triton_repo(sub)  # irpe triton-repo (export/triton_repo_cli.py)
