"""`irpe bench`: models, ops, serve and report subcommands (heavy imports inside commands)."""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Sequence

from benchmarks.common import choice_list, int_list, size_list
from benchmarks.fits import fits
from benchmarks.report import envelope, out_dir, render, save
from irpe.errors import InvalidInput

__all__ = ["add_parser"]


def _cache(what: str) -> Path:
    """Scratch folder for exported models (outside the results folder)."""
    return Path(tempfile.gettempdir()) / f"irpe-bench-{what}"


def _print_files(paths: Sequence[Path]) -> None:
    for path in paths:
        print(f"wrote {path}")


def cmd_models(args: argparse.Namespace) -> int:
    """Plain vs iRPE models across backends, batches and precisions."""
    from benchmarks import models_bench as mb
    families = choice_list(args.models or ("deit_tiny" if args.quick else "deit_tiny,deit_small"),
                           list(mb.FAMILIES), "model family")
    backends = choice_list(args.backends, mb.BACKENDS, "backend")
    precisions = choice_list(args.precisions, mb.PRECISIONS, "precision")
    batches = int_list(args.batches or ("1" if args.quick else "1,8"))
    detr_sizes = size_list(args.detr_sizes) if args.detr_sizes else list(mb.DETR_SIZES)
    if args.quick:
        args.repeats, args.warmup = 2, 1
    folder = out_dir(args.out)
    only = choice_list(args.variants, mb.VARIANTS, "variant") if args.variants else None
    cfg = {"device": args.device, "threads": args.threads, "repeats": args.repeats,
           "warmup": args.warmup, "cache": _cache("onnx"), "variants": only}
    if "onnxruntime" in backends:  # one pool: no session's idle workers spin beside another's
        from irpe.runtime.onnxruntime.session import share_thread_pool
        cfg["ort_thread_pool"] = "shared" if share_thread_pool(args.threads) else "per session"
    jobs = mb.plan(families, batches, backends, precisions, args.quick, detr_sizes, args.device)
    results = mb.run_all(jobs, cfg)
    settings = {**{k: v for k, v in cfg.items() if k != "cache"}, "models": families,
                "backends": backends, "precisions": precisions, "batches": batches,
                "detr_sizes": [f"{h}x{w}" for h, w in detr_sizes], "quick": args.quick}
    notes = ["latency = one forward of the whole batch; img/s = batch / p50; x plain = p50 / "
             "p50 of the plain model timed round-robin in the same run",
             "RSS+ = RSS growth over build + first forward; peak = process peak RSS so far; "
             "build s = build (+ ONNX export when not cached, + torch.compile) + first forward",
             *(["on CUDA: RSS+ = torch.cuda.memory_allocated growth, peak = "
                "torch.cuda.max_memory_allocated (nvml_used_mb: NVML device total, when pynvml "
                "is present); fp16 = .half(), bf16 = .to(torch.bfloat16)"]
               if args.device.startswith("cuda") else []),
             *([f"onnxruntime rows: {cfg['ort_thread_pool']} thread pool (with a pool per "
                "session, the idle workers of the session that ran last spin beside the next "
                "one: docs/export.md)"] if "ort_thread_pool" in cfg else []),
             *mb.skipped(backends, precisions, args.device), *mb.compile_notes(results),
             *(["timm: not importable here, so timm's plain model was not run"]
               if only and "timm" in only and not mb.timm_available() else []),
             *args.note]
    doc = envelope("models", settings, results, notes)
    _print_files(save(doc, folder, args.tag))
    return 0


def cmd_ops(args: argparse.Namespace) -> int:
    """The iRPE op benchmark (ops_cpu, or ops_gpu on CUDA) in the bench report format."""
    from benchmarks import ops_bench
    settings, results = ops_bench.run(args.quick, args.threads, args.repeats)
    doc = envelope("ops", settings, results, [*ops_bench.notes(settings), *args.note])
    doc["fits"] = fits(results)
    _print_files(save(doc, out_dir(args.out), args.tag))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """HTTP load against `irpe serve` in a child process: closed- and open-loop; vs in-process."""
    from benchmarks import serve_bench
    conc = int_list(args.concurrency)
    models = choice_list(args.models, list(serve_bench.MODELS), "serve model")
    if args.quick:
        conc, args.duration, args.rate, models = conc[:2], 1.0, min(args.rate, 10.0), ["tiny"]
    if min(args.rate, args.rate_deit_s, args.duration) <= 0:
        raise InvalidInput("--rate, --rate-deit-s and --duration must be positive")
    if args.precision == "int8" and args.backend != "openvino":
        raise InvalidInput("--precision int8 runs on --backend openvino (an NNCF-quantised IR)")
    cuda = args.device.startswith("cuda")
    per_request = int_list(args.images_per_request or ("1,8" if cuda else "1"))
    settings = {"backend": args.backend, "models": models, "concurrency": conc,
                "rate": {"tiny": args.rate, "deit_s": args.rate_deit_s},
                "duration_s": args.duration, "max_batch_size": args.max_batch,
                "threads": args.threads, "quick": args.quick, "device": args.device,
                "precision": args.precision, "instances": args.instances,
                "cuda_graphs": args.cuda_graphs or None, "images_per_request": per_request,
                "image": args.image or ("jpeg" if cuda else "png")}
    results, hist = serve_bench.run(settings, _cache("serve"))
    notes = ["server: `python -m irpe serve REPO.yaml` child process, one model; load: asyncio + "
             "httpx in the bench process, one keep-alive connection per client",
             f"in-process = {settings['image'].upper()} decode + resize to uint8 "
             "(serve.preprocess_pool.decode_u8) + backend.infer_uint8, sequential batches of "
             "max_batch_size; backend = backend.infer on batches of zeros; HTTP / in-process = "
             "best closed-loop img/s / in-process img/s per images-per-request count (HTTP / "
             "backend in the JSON); img/s counts images", *args.note]
    doc = envelope("serve", settings, results, notes)
    doc["batch_histogram"] = hist
    _print_files(save(doc, out_dir(args.out), args.tag))
    return 0


def cmd_attention(args: argparse.Namespace) -> int:
    """Fused iRPE attention vs unfused vs SDPA: one layer and whole models (CUDA; --smoke: CPU)."""
    from benchmarks import attention_bench as ab
    parts = tuple(choice_list(args.parts, ["layers", "models"], "part"))
    terms = tuple(choice_list(args.terms, ["k", "q", "v", "qk", "kv", "qkv"], "iRPE terms"))
    if min(args.rounds, args.iters) < 1 or args.warmup < 0:
        raise InvalidInput("--rounds and --iters must be >= 1, --warmup >= 0")
    settings, results = ab.run(args.dtype, args.rounds, args.iters, args.warmup, args.smoke,
                               parts, terms)
    notes = ["round-robin: every round times each variant of a case once (iters calls); median "
             "and best over rounds, spread = slowest / fastest round; x baseline = median / "
             "median of the case's baseline (sdpa_no_rpe for layers, plain for models)",
             "peak MB = torch.cuda.max_memory_allocated over one call (weights and inputs "
             "included)", *(["SMOKE RUN on the CPU Triton interpreter: times are meaningless"]
                            if args.smoke else []), *args.note]
    doc = envelope("attention", settings, results, notes)
    _print_files(ab.save(doc, out_dir(args.out), args.tag))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Regenerate Markdown and plots from every bench_*.json in the folder."""
    folder = out_dir(args.out)
    paths = sorted(folder.glob("bench_*.json"))
    if not paths:
        raise InvalidInput(f"no bench_*.json in {folder}")
    for path in paths:
        _print_files(render(path))
    return 0


def _common(p: argparse.ArgumentParser, threads: int = 2,
            quick: str = "a short run that checks the report files") -> None:
    p.add_argument("--quick", action="store_true", help=quick)
    p.add_argument("--threads", type=int, default=threads, help="CPU threads")
    p.add_argument("--out", type=Path, help="results folder (default benchmarks/results/<device>)")
    p.add_argument("--note", action="append", default=[], help="a line for the report notes")
    p.add_argument("--tag", help="write bench_<kind>_<TAG>.* (keeps the default report)")


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``irpe bench`` and its subcommands."""
    p = sub.add_parser("bench", help="benchmarks: models, ops, serve, attention, report")
    bench = p.add_subparsers(dest="bench_command", required=True, metavar="WHAT")
    m = bench.add_parser("models", help="plain vs iRPE models x backends x batch x precision")
    m.add_argument("--models", help="families: deit_tiny, deit_small, deit_base, detr_small, "
                   "detr_r50 (default deit_tiny,deit_small; --quick: deit_tiny)")
    m.add_argument("--backends", default="eager,onnxruntime", help="eager, compile, onnxruntime "
                   "(CPU), cudagraph (CUDA)")
    m.add_argument("--precisions", default="fp32", help="fp32, fp16 (CUDA), bf16 (torch "
                   "backends; CUDA: cast, CPU: autocast)")
    m.add_argument("--batches", help="comma-separated batch sizes (default 1,8; --quick: 1)")
    m.add_argument("--variants", help="only these of each family: plain, irpe_k, irpe_qk, "
                   "irpe_qkv, timm (timm's plain DeiT, when timm imports; default: every "
                   "iRPE-registry variant)")
    m.add_argument("--repeats", type=int, default=7, help="timed rounds (median)")
    m.add_argument("--warmup", type=int, default=2, help="untimed rounds")
    m.add_argument("--device", default="cpu", help="torch device (cpu, cuda)")
    m.add_argument("--detr-sizes", help="DETR input sizes HxW (default 480x640,800x1216; "
                   "--quick: the first)")
    _common(m, quick="deit_tiny at batch 1 (unless --models / --batches say otherwise), 2 "
            "repeats: checks the report files in a minute or two on a 2-core CPU (the first run "
            "also exports the ONNX files)")
    m.set_defaults(func=cmd_models)
    o = bench.add_parser("ops", help="iRPE gather/scatter ops vs official, cost vs L")
    o.add_argument("--repeats", type=int, default=7, help="timed rounds (median)")
    _common(o, threads=1)
    o.set_defaults(func=cmd_ops)
    s = bench.add_parser("serve", help="HTTP load generator against an `irpe serve` process")
    s.add_argument("--backend", choices=("torch", "onnxruntime", "openvino"),
                   default="onnxruntime", help="openvino: the ONNX export on OpenVINO's CPU "
                   "plugin (--precision bf16 on a CPU with BF16)")
    s.add_argument("--models", default="tiny,deit_s", help="tiny (shapes 64x64), deit_s "
                   "(DeiT-S iRPE-K 224x224); --quick: tiny")
    s.add_argument("--concurrency", default="1,4,16", help="closed-loop client counts")
    s.add_argument("--rate", type=float, default=20.0, help="open-loop requests/s (tiny)")
    s.add_argument("--rate-deit-s", type=float, default=4.0, help="open-loop requests/s (deit_s)")
    s.add_argument("--duration", type=float, default=5.0, help="seconds per load level")
    s.add_argument("--max-batch", type=int, default=8, help="server max_batch_size")
    s.add_argument("--device", default="cpu", help="model device: cpu, cuda, cuda:N")
    s.add_argument("--precision", choices=("fp32", "fp16", "bf16", "int8"), help="torch / "
                   "openvino precision (default: fp16 on cuda, fp32 on cpu); int8: openvino "
                   "serves the export quantised by irpe quantize --target openvino (NNCF)")
    s.add_argument("--instances", type=int, help="model instances in the server")
    s.add_argument("--cuda-graphs", action="store_true", help="torch on cuda: CUDA graphs")
    s.add_argument("--image", choices=("png", "jpeg"), help="request image: the shapes PNG "
                   "(default on cpu) or a 451x300 JPEG (default on cuda)")
    s.add_argument("--images-per-request", help="comma-separated counts (default 1; cuda: 1,8)")
    _common(s, threads=1)
    s.set_defaults(func=cmd_serve)
    a = bench.add_parser("attention", help="fused iRPE attention vs unfused vs SDPA (CUDA)")
    a.add_argument("--dtype", choices=("fp16", "bf16", "fp32"), default="fp16")
    a.add_argument("--parts", default="layers,models", help="layers, models")
    a.add_argument("--terms", default="k,qkv", help="iRPE terms of the layer cases")
    a.add_argument("--rounds", type=int, default=5, help="round-robin rounds")
    a.add_argument("--iters", type=int, default=20, help="calls per timed sample")
    a.add_argument("--warmup", type=int, default=3, help="untimed calls per variant")
    a.add_argument("--smoke", action="store_true", help="tiny CPU run on the Triton "
                   "interpreter (checks the report; times meaningless)")
    a.add_argument("--out", type=Path, help="results folder (default benchmarks/results/<device>)")
    a.add_argument("--note", action="append", default=[], help="a line for the report notes")
    a.add_argument("--tag", help="write bench_attention_<TAG>.*")
    a.set_defaults(func=cmd_attention)
    r = bench.add_parser("report", help="regenerate Markdown + PNG plots from the JSON")
    r.add_argument("--out", type=Path, help="results folder (default benchmarks/results/<device>)")
    r.set_defaults(func=cmd_report)
