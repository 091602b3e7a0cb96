"""``irpe quantize``: an exported ONNX file -> an int8 ONNX file (export/quantize.py)."""
from __future__ import annotations

import argparse

from irpe.argtypes import number
from irpe.errors import CLIError

__all__ = ["add_parser", "cmd_quantize"]


def _default_output(model: str) -> str:
    stem = model[:-5] if model.endswith(".onnx") else model
    return stem + ".int8.onnx"


def cmd_quantize(args: argparse.Namespace) -> int:
    """Quantise the file; prints what was quantised and how."""
    import logging

    from .quantize import (
        Activations,
        CalibrationMethod,
        QuantizeSettings,
        QuantMode,
        Target,
        quantize,
    )
    mode = QuantMode(args.mode)
    if mode is QuantMode.STATIC and not args.calibration:
        raise CLIError("static quantisation needs --calibration DIR|shapes "
                       "(or --mode dynamic, which needs no data)")
    settings = QuantizeSettings(mode=mode, calibration=args.calibration,
                                samples=args.samples, batch=args.batch,
                                method=CalibrationMethod(args.method),
                                per_channel=not args.per_tensor, seed=args.seed,
                                input_layers=args.quantize_input_layers,
                                target=Target(args.target),
                                activations=Activations(args.activations),
                                excluded=tuple(args.exclude))
    output = args.output or _default_output(args.model)
    logging.getLogger().setLevel(logging.ERROR)  # the quantiser's advice goes to the root logger
    try:
        record = quantize(args.model, output, settings)
    except (ValueError, OSError, CLIError):
        raise
    except Exception as exc:  # onnxruntime's own errors (calibration runs a session)
        text = str(exc).strip().splitlines()
        raise CLIError(f"quantisation failed: {text[0] if text else type(exc).__name__}") \
            from None
    import os
    how = (f"calibrated on {record['calibration']} ({record['samples']} images, "
           f"{record['method']})" if mode is QuantMode.STATIC else "activations dynamic")
    acts = ", activations uint8" if settings.activations is Activations.UINT8 else ""
    print(f"wrote {output} ({os.path.getsize(output) / 1e6:.1f} MB): int8 {mode.value} "
          f"{record['format']}, weights {record['weights']}{acts}, {how}; "
          f"{record['quantized_nodes']} layers quantised, {record['float_nodes']} kept float "
          "(attention MatMuls, input layers, --exclude)")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``irpe quantize``."""
    p = sub.add_parser("quantize", help="int8 post-training quantisation of an exported file "
                                        "(ONNX Runtime; iRPE ops and attention stay float)")
    p.add_argument("model", help="ONNX file from `irpe export`")
    p.add_argument("-o", "--output", help="file to write (default: <model>.int8.onnx)")
    p.add_argument("--calibration", help="folder of images (subfolders too) or 'shapes' (the "
                                         "synthetic set); static mode only")
    p.add_argument("--mode", choices=["static", "dynamic"], default="static",
                   help="static: calibrated QDQ (default); dynamic: weights only, no data")
    p.add_argument("--samples", type=number(int, 1), default=64, help="calibration images")
    p.add_argument("--batch", type=number(int, 1), default=8, help="calibration batch size")
    p.add_argument("--method", choices=["minmax", "percentile", "entropy"], default="minmax",
                   help="calibration method (default minmax)")
    p.add_argument("--per-tensor", action="store_true",
                   help="one weight scale per tensor (default: per output channel)")
    p.add_argument("--quantize-input-layers", action="store_true",
                   help="also quantise the layers reading the image (kept float by default)")
    p.add_argument("--target", choices=["onnxruntime", "tensorrt"], default="onnxruntime",
                   help="runtime the QDQ file is for: tensorrt = symmetric activations and "
                        "float biases, the forms TensorRT's parser accepts (static mode)")
    p.add_argument("--activations", choices=["int8", "uint8"], default="int8",
                   help="static, onnxruntime: calibrated activations as int8 (symmetric) or "
                   "uint8 (asymmetric: ONNX Runtime's faster x86 kernels, some accuracy cost; "
                   "docs/quantize.md)")
    p.add_argument("--seed", type=int, default=0, help="shapes set seed")
    p.add_argument("--exclude", action="append", default=[], metavar="NODE",
                   help="also keep this node float (repeatable)")
    p.set_defaults(func=cmd_quantize)
