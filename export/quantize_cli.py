"""``irpe quantize``: an exported ONNX file -> an int8 ONNX file for ONNX Runtime or TensorRT
(export/quantize.py), or an int8 OpenVINO IR, ``.xml`` + ``.bin`` (``--target openvino``,
export/quantize_openvino.py)."""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys

from irpe.argtypes import number
from irpe.artifact.names import companions
from irpe.errors import CLIError

__all__ = ["add_parser", "cmd_quantize"]


def _default_output(model: str, target: str = "onnxruntime") -> str:
    """``<model>.int8.onnx``, or ``<model>.int8.xml`` (an IR) for ``--target openvino``."""
    stem = model[:-5] if model.endswith(".onnx") else model
    return stem + (".int8.xml" if target == "openvino" else ".int8.onnx")


def _from_onnxruntime(exc: Exception) -> bool:
    """An error of onnxruntime's own (calibration runs a session: Fail, InvalidGraph, ... of
    onnxruntime.capi), which says what ONNX Runtime could not do with the user's file."""
    return type(exc).__module__.startswith("onnxruntime")


def cmd_quantize(args: argparse.Namespace) -> int:
    """Quantise the file; prints one summary line on stdout (what was quantised and how, the
    size of every file written), and nothing else there: the quantisers' chatter goes to
    stderr. A missing input is named before any option is judged."""
    from irpe.artifact.filecheck import check_file

    from .quantize import Activations as Acts
    from .quantize import CalibrationMethod, QuantizeSettings, QuantMode, Target, quantize
    check_file(args.model, "onnx")
    mode = QuantMode(args.mode)
    if mode is QuantMode.STATIC and not args.calibration:
        raise CLIError("static quantisation needs --calibration DIR|shapes "
                       "(or --mode dynamic, which needs no data)")
    settings = QuantizeSettings(mode=mode, calibration=args.calibration,
                                samples=args.samples, batch=args.batch,
                                method=CalibrationMethod(args.method),
                                per_channel=not args.per_tensor, seed=args.seed,
                                input_layers=args.quantize_input_layers,
                                target=Target(args.target), activations=Acts(args.activations),
                                excluded=tuple(args.exclude))
    output = args.output or _default_output(args.model, args.target)
    logging.getLogger().setLevel(logging.ERROR)  # the quantiser's advice goes to the root logger
    try:
        with contextlib.redirect_stdout(sys.stderr):  # entropy / percentile progress lines
            record = quantize(args.model, output, settings)
    except Exception as exc:
        if not _from_onnxruntime(exc):  # ours: a user error is one line, a bug a traceback
            raise
        text = str(exc).strip().splitlines()
        raise CLIError(f"quantisation failed: {text[0] if text else type(exc).__name__}") \
            from None
    size = sum(os.path.getsize(part) for part in companions(output))  # an IR: .xml + .bin
    print(f"wrote {output} ({size / 1e6:.1f} MB): int8 {mode.value} "
          f"{record['format']}, weights {record['weights']}, "
          f"activations {record['activations'].replace(' calibrated', '')}{_how(record, args)}; "
          f"{record['quantized_nodes']} layers quantised, {record['float_nodes']} kept float "
          "(attention MatMuls, input layers, --exclude)")
    return 0


def _how(record: dict, args: argparse.Namespace) -> str:
    """The calibration part of the summary: the images really used (a folder may hold fewer
    than --samples)."""
    if record["mode"] != "static":
        return ""
    used = record["samples"]
    short = (f"; the folder has {used} of the {args.samples} requested"
             if used < args.samples else "")
    return (f", calibrated on {record['calibration']} ({used} image{'s' * (used != 1)}, "
            f"{record['method']}{short})")


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``irpe quantize``."""
    p = sub.add_parser("quantize", help="int8 post-training quantisation of an exported file: "
                       "an int8 ONNX file (ONNX Runtime, TensorRT) or OpenVINO IR (NNCF); iRPE "
                       "ops and attention stay float")
    p.add_argument("model", help="ONNX file from `irpe export`")
    p.add_argument("-o", "--output", help="file to write (default: <model>.int8.onnx; "
                   "--target openvino: <model>.int8.xml, its weights beside it as .bin); never "
                   "one of the input's files nor a folder")
    p.add_argument("--calibration", help="folder of images (subfolders too) or 'shapes' (the "
                                         "synthetic set); static mode only")
    p.add_argument("--mode", choices=["static", "dynamic"], default="static",
                   help="static: calibrated QDQ (default); dynamic: weights only, no data")
    p.add_argument("--samples", type=number(int, 1), default=64, help="calibration images")
    p.add_argument("--batch", type=number(int, 1), help="calibration batch size (default 8; "
                   "not with --target openvino: NNCF calibrates one image at a time)")
    p.add_argument("--method", choices=["minmax", "percentile", "entropy"], default="minmax",
                   help="calibration method (default minmax)")
    p.add_argument("--per-tensor", action="store_true",
                   help="one weight scale per tensor (default: per output channel)")
    p.add_argument("--quantize-input-layers", action="store_true",
                   help="also quantise the layers reading the image (kept float by default)")
    p.add_argument("--target", choices=["onnxruntime", "tensorrt", "openvino"],
                   default="onnxruntime",
                   help="runtime the file is for: tensorrt = static QDQ with symmetric int8 "
                        "activations and float biases, the forms TensorRT's parser accepts "
                        "(refused with --mode dynamic); openvino = an OpenVINO IR (-o NAME.xml) "
                        "quantised by NNCF")
    p.add_argument("--activations", choices=["int8", "uint8"], default="int8",
                   help="static, onnxruntime: the calibrated activations' type; both asymmetric "
                   "with the same scales (uint8 zero point = int8's + 128), so the same values: "
                   "the type picks ONNX Runtime's kernel (docs/quantize.md)")
    p.add_argument("--seed", type=int, default=0, help="shapes set seed")
    p.add_argument("--exclude", action="append", default=[], metavar="NODE",
                   help="also keep this quantised layer float (repeatable; an unknown name is "
                        "refused with the list of valid ones)")
    p.set_defaults(func=cmd_quantize)
