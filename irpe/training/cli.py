"""``irpe train`` and ``irpe eval`` (heavy imports happen inside the commands)."""
from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Union, cast

from ..argtypes import number, positive
from ..artifact.files import file_kind
from ..errors import CLIError

if TYPE_CHECKING:  # imported inside the commands (`irpe` starts without them)
    from torch import nn

    from ..artifact.trained import ModelSpec
    from ..data.datasets import CocoDetection, ImageFolder, ShapesClassification, ShapesDetection

    DetectionSet = Union[ShapesDetection, CocoDetection]
    EvalSet = Union[ShapesClassification, ImageFolder, DetectionSet]

TASK_NAMES = {"cls": "classification", "det": "detection"}
RUN_FILES = ("model.safetensors", "last.pt", "last.pt.tmp", "log.jsonl")  # what --force removes
# recipe defaults per task: DeiT (AdamW 5e-4, wd 0.05, smoothing 0.1) and DETR (1e-4, wd 1e-4,
# backbone 1e-5, grad clip 0.1); explicit flags override them
RECIPES: Dict[str, Dict] = {
    "classification": dict(lr=5e-4, weight_decay=0.05, warmup_epochs=1.0, clip_grad=0.0,
                           batch_size=64, label_smoothing=0.1, drop_path=0.1, lr_backbone=0.0),
    "detection": dict(lr=1e-4, weight_decay=1e-4, warmup_epochs=0.0, clip_grad=0.1,
                      batch_size=16, label_smoothing=0.0, drop_path=0.0, lr_backbone=1e-5),
}


def cmd_train(args: argparse.Namespace) -> int:
    """Train a registered model on a directory or on the synthetic shapes set."""
    from .train import CONFIG_FIELDS, TrainConfig, train
    task = TASK_NAMES[args.task]
    values = dict(RECIPES[task])
    values.update({k: v for k, v in vars(args).items() if k in CONFIG_FIELDS and v is not None})
    values.update(task=task, progress=not args.no_progress)
    if args.data != "shapes" and not os.path.isdir(args.data):
        raise CLIError(f"data directory not found: {args.data} (or use --data shapes)")
    _check_output(args.output, args.resume, args.force, args.init)
    record = train(TrainConfig(**values))
    if os.environ.get("RANK", "0") != "0":  # torchrun: rank 0 reports
        return 0
    print(_outcome(record, args), flush=True)
    return 0


def _outcome(record: Dict, args: argparse.Namespace) -> str:
    """The last line of ``irpe train``: the best completed epoch; a run stopped before one
    completed (``--max-steps``); or a resumed run that had nothing left to train (exit 0,
    nothing written: docs/training.md)."""
    model = os.path.join(args.output, "model.safetensors")
    if record.get("finished"):
        return (f"done: nothing to train: {args.resume} already completed {record['epoch']} "
                f"epochs (--epochs {record['epochs']}); its best "
                f"{record['best']:.4g} is in {model}; raise --epochs to train on")
    if record["best"] == float("-inf"):  # stopped (--max-steps) inside the first epoch
        return (f"done: stopped after {record['step']} steps, before epoch 1 completed "
                f"({record['train_seconds']:.0f} s) -> {model} (provisional: the weights at "
                "the stop; the first completed epoch replaces it)")
    done = record["epoch"] - (1 if record.get("partial") else 0)
    stop = f", stopped at step {record['step']} (--max-steps)" if record.get("partial") else ""
    return (f"done: best {record['best']:.4g} after {done} epochs{stop} "
            f"({record['train_seconds']:.0f} s) -> {model}")


def _check_output(out: str, resume: Optional[str], force: bool,
                  init: Optional[str] = None) -> None:
    """Refuse a non-empty run folder (a finished run would be overwritten and its log appended
    to) unless the run resumes, and run files that are inputs (irpe.outputs: ``--init`` or
    ``--resume`` naming them; a run's own ``last.pt`` resumed is the state it replaces and
    stays allowed); ``--force`` removes only the files a run writes, after those checks."""
    from ..outputs import check_outputs, same_file
    if os.path.exists(out) and not os.path.isdir(out):
        raise CLIError(f"{out} exists and is not a directory")
    own_state = resume is not None and same_file(resume, os.path.join(out, "last.pt"))
    check_outputs([os.path.join(out, name) for name in RUN_FILES],
                  [init, None if own_state else resume])
    if resume or not os.path.isdir(out) or not os.listdir(out):
        return
    if not force:
        raise CLIError(f"{out} is not empty; pass --resume {os.path.join(out, 'last.pt')} to "
                       "continue that run or --force to start it over")
    for name in RUN_FILES:
        path = os.path.join(out, name)
        if os.path.isfile(path):
            os.unlink(path)


def load_for_eval(model: str, checkpoint: Optional[str] = None, runtime: Optional[str] = None,
                  precision: Optional[str] = None) -> Tuple["nn.Module", "ModelSpec"]:
    """(model, spec) from a trained-model file, an exported/quantised .onnx or OpenVINO IR .xml
    (on the runtime irpe.runtime.pick picks, or ``runtime``), or a registered name
    (+ checkpoint/bundled). ``precision`` (fp32 / bf16) is OpenVINO's."""
    from ..artifact.trained import default_spec, load_trained, read_spec
    from ..checkpoint import CheckpointError
    from ..models import create_model, model_info
    from ..models.registry import bundled_weights
    if file_kind(model) != "trained":  # an exported, quantised or compiled file
        return _open_exported(model, runtime, precision)
    if runtime or precision:
        raise CLIError(f"--runtime / --precision run an exported .onnx, an OpenVINO IR .xml or "
                       f"an engine, not {model}")
    if os.path.isfile(model):
        return load_trained(model)
    if os.sep in model or model.endswith((".safetensors", ".pth", ".pt", ".onnx", ".xml")):
        raise CLIError(f"file not found: {model}")
    info = model_info(model)
    if checkpoint is None:
        if info.weights is None:
            raise CLIError(f"{model} has no bundled weights: pass --checkpoint FILE")
        checkpoint = bundled_weights(info)
    try:  # a trained-model file carries its class names and transform
        spec, _ = read_spec(checkpoint)
    except CheckpointError:
        spec = default_spec(model)
    if spec.model_name != model:
        raise CLIError(f"{checkpoint} holds a {spec.model_name}, not a {model}")
    net = create_model(model, checkpoint=checkpoint, **spec.build_overrides())
    return net.eval(), spec


def _open_exported(model: str, runtime: Optional[str], precision: Optional[str]
                   ) -> Tuple["nn.Module", "ModelSpec"]:
    """An exported file opened on the runtime irpe.runtime.pick picks (the one that serves it)
    or ``runtime``; ``precision`` (fp32 / bf16) is OpenVINO's."""
    import torch

    from ..runtime.onnxruntime.session import OrtOptions
    from ..runtime.openvino.session import OvOptions
    from ..runtime.pick import open_file, pick_runtime
    from .evaluate import FileModel
    if not os.path.isfile(model):
        raise CLIError(f"file not found: {model}")
    chosen = pick_runtime(model, "cpu", runtime)
    if precision is not None and chosen != "openvino":
        raise CLIError(f"--precision is OpenVINO's, but {model} runs on {chosen} (which runs "
                       "the file in the precision it was exported in); add --runtime openvino")
    threads = torch.get_num_threads()
    file = open_file(model, chosen, ort=OrtOptions.from_env(), threads=threads,
                     ov=OvOptions.from_env().with_(precision or "fp32", threads))
    net = FileModel(file)
    return cast("nn.Module", net), net.spec  # called as a module by the eval loops


def cmd_eval(args: argparse.Namespace) -> int:
    """Top-1/top-5 or COCO mAP of a model on a directory or the synthetic shapes set.

    Under torchrun every process scores its shard; rank 0 prints and writes the JSON.
    """
    import torch
    from torch.utils.data import DataLoader

    from .distributed import ShardSampler, setup, teardown
    from .evaluate import evaluate_classification, evaluate_detection
    if args.json:
        from ..outputs import check_outputs
        check_outputs([args.json], [path for path in (args.model, args.checkpoint, args.data)
                                    if path and os.path.exists(path)])
        if not os.path.isdir(os.path.dirname(os.path.abspath(args.json))):
            raise CLIError(f"--json {args.json}: folder {os.path.dirname(args.json)} not found")
    torch.set_num_threads(args.threads)
    dist, device = setup(args.device)
    ended_well = False
    try:
        model, spec = load_for_eval(args.model, args.checkpoint, args.runtime, args.precision)
        model = model.to(device)
        dataset, category_ids = _eval_dataset(spec, args)
        if spec.task == "classification":
            loader = DataLoader(dataset, batch_size=args.batch_size,
                                sampler=ShardSampler(len(dataset), dist))
            metrics = evaluate_classification(model, loader, device, dist)
        else:  # a detection model's set (_eval_dataset)
            metrics = evaluate_detection(model, cast("DetectionSet", dataset), args.batch_size,
                                         device, category_ids, dist)
        ended_well = True
    finally:
        teardown(dist, meet=ended_well)
    if dist.main:
        _report(spec, args, metrics, getattr(model, "description", None))
    return 0


def _report(spec: "ModelSpec", args: argparse.Namespace, metrics: Dict,
            runtime: Optional[str] = None) -> None:
    print(f"{spec.model_name} on {args.data} ({args.split}, {metrics['images']} images)"
          + (f", {runtime}" if runtime else ""))
    for key, value in metrics.items():
        if key != "images":
            print(f"  {key:<6} {value:8.3f}")
    if args.json:
        from irpe.atomic import atomic_open
        with atomic_open(args.json) as fh:
            json.dump({"model": spec.model_name, "data": args.data, "split": args.split,
                       "metrics": metrics, **({"runtime": runtime} if runtime else {})}, fh,
                      indent=2)


def _eval_dataset(spec: "ModelSpec", args: argparse.Namespace,
                  ) -> Tuple["EvalSet", Optional[List[int]]]:
    """(dataset, dataset category id of each model label or None) for ``irpe eval``."""
    from ..data.datasets import (
        CocoDetection,
        ImageFolder,
        ShapesClassification,
        ShapesDetection,
        check_same_classes,
    )
    tf = spec.transform()
    if args.data == "shapes":
        if spec.task == "classification":
            return ShapesClassification(args.shapes_val, args.seed, tf.size, tf,
                                        split=args.split), None
        return ShapesDetection(args.shapes_val, args.seed, transform=tf, split=args.split), None
    if not os.path.isdir(args.data):
        raise CLIError(f"data directory not found: {args.data} (or use --data shapes)")
    if spec.task == "classification":
        folder = ImageFolder(os.path.join(args.data, args.split), tf)
        check_same_classes(folder.classes, spec.class_names,  # ValueError: `irpe` exits 2
                           f"class folders of {folder.root}", "model's classes")
        return folder, None
    dataset = CocoDetection(args.data, args.split, tf)
    check_same_classes(dataset.categories, spec.class_names, f"categories of "
                       f"{dataset.ann_path}", "model's classes", ordered=False)
    # matched by name, any order
    id_of = dict(zip(dataset.categories, dataset.category_ids, strict=True))
    return dataset, [id_of[name] for name in spec.class_names]


def _add_train(sub: Any) -> None:
    p = sub.add_parser("train", help="train a model (DeiT recipe / DETR set loss)")
    p.add_argument("task", choices=sorted(TASK_NAMES), help="cls (ImageFolder) or det (COCO)")
    p.add_argument("--model", required=True, help="registered model name")
    p.add_argument("--data", required=True, help="dataset directory, or 'shapes' (synthetic)")
    p.add_argument("--output", required=True, help="run directory (model, log, last.pt)")
    p.add_argument("--epochs", type=positive)
    p.add_argument("--batch-size", type=positive, help="images per micro-batch and process")
    p.add_argument("--grad-accum-steps", type=positive,
                   help="micro-batches summed into one optimiser step (1): global batch = "
                        "batch size x processes x this")
    for flag in ("lr", "min-lr", "lr-backbone", "weight-decay", "warmup-epochs",
                 "label-smoothing", "mixup", "cutmix", "drop-path", "clip-grad"):
        p.add_argument(f"--{flag}", type=number(float, 0))
    p.add_argument("--no-hflip", dest="hflip", action="store_false", default=None)
    p.add_argument("--init", help="start from these weights (tensors of matching shape)")
    p.add_argument("--resume", help="continue from a run's last.pt")
    p.add_argument("--force", action="store_true",
                   help="start over in a non-empty --output (removes its model, log, last.pt)")
    p.add_argument("--device", help="cpu, cuda, cuda:1 (default: cuda if available)")
    p.add_argument("--no-amp", dest="amp", action="store_false", default=None)
    for flag in ("seed", "threads", "workers", "max-steps"):
        p.add_argument(f"--{flag}", type=int)
    p.add_argument("--shapes-train", type=positive, help="synthetic training images")
    p.add_argument("--shapes-val", type=positive, help="synthetic validation images")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--freeze-bn", action="store_true", default=None,
                   help="keep BatchNorm statistics fixed (fine-tuning; exact multi-process runs)")
    p.add_argument("--dist-timeout", type=number(float, 1),
                   help="torchrun runs: seconds to wait for a peer before failing (600)")
    p.set_defaults(func=cmd_train)


def _add_eval(sub: Any) -> None:
    p = sub.add_parser("eval", help="top-1/top-5 or COCO mAP on a validation set")
    p.add_argument("model", help="trained-model .safetensors, exported/quantised .onnx (ONNX "
                                 "Runtime or OpenVINO, CPU), OpenVINO IR .xml, or a registered "
                                 "name")
    p.add_argument("--runtime", choices=["auto", "onnxruntime", "openvino", "tensorrt"],
                   help="what runs an exported file (default auto: the runtime irpe serve and "
                        "irpe validate run it on: an .onnx on openvino on the CPU where "
                        "installed, else onnxruntime; an .xml on openvino)")
    p.add_argument("--precision", choices=["fp32", "bf16"],
                   help="OpenVINO's precision (default fp32, set explicitly; bf16 needs a CPU "
                        "with BF16)")
    p.add_argument("--checkpoint", help="weights for a registered name (default: bundled)")
    p.add_argument("--data", default="shapes", help="dataset directory, or 'shapes'")
    p.add_argument("--split", default="val")
    p.add_argument("--batch-size", type=positive, default=32)
    p.add_argument("--shapes-val", type=positive, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=positive, default=2)
    p.add_argument("--device", default="auto",
                   help="cpu, cuda, cuda:1 (default: cuda if available; torchrun: cuda:LOCAL_RANK)")
    p.add_argument("--json", help="also write the metrics to this JSON file")
    p.set_defaults(func=cmd_eval)


def add_parser(sub: Any) -> None:
    """Register ``irpe train`` and ``irpe eval``."""
    _add_train(sub)
    _add_eval(sub)
