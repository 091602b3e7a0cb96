"""Python side of the TensorRT plugin harness (test aid): build it with CMake, write its cases
(plugin nodes of ONNX files + inputs), run it, and compare its outputs with irpe.ops.

Index nodes (RPEGather for iRPE-K, the 1-row RPEGather of iRPE-Q, RPEScatter for iRPE-V) come
from a tiny DeiT iRPE-QKV exported by export/, with the index tensors the file holds. export/
does not emit the on-the-fly *Grid nodes, so those come from a small hand-written ONNX file with
the attributes such a node carries. Every node runs in fp32/fp16/bf16 (index nodes: with int64
and int32 ids), which is every mode and dtype the plugin advertises.
"""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import onnx
import torch
from onnx import helper, numpy_helper

from irpe.artifact.contract import MIN_OPSET
from irpe.bucket import bucket_ids, num_buckets
from irpe.ops import rpe_gather, rpe_scatter

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "int32": torch.int32, "int64": torch.int64}
VALUE_DTYPES = ("float32", "float16", "bfloat16")
# on-the-fly nodes: (method, ratio, skip, grid H, grid W); 1 cls token on odd grids, and DETR's
# table (product 2.0, no skip: 81 buckets)
GRIDS = [("euc", 2.0, 1, 3, 4), ("quant", 2.0, 1, 4, 3), ("product", 1.9, 1, 3, 5),
         ("product", 2.0, 0, 6, 7), ("cross_rows", 2.0, 1, 3, 4), ("cross_cols", 2.0, 0, 4, 5)]
BATCH, HEADS = 2, 2
SCATTER_TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}


@dataclass
class Node:
    """One plugin node: op type, attributes, (index nodes) the index tensor of the file, and
    whether ONNX shape inference gives its input 0 one query row (the broadcast iRPE-Q table)."""
    op_type: str
    attrs: Dict[str, object]
    index: Optional[torch.Tensor] = None
    one_row: bool = False


@dataclass
class Case:
    """A written case: its folder and what the harness's output must equal."""
    folder: Path
    op_type: str
    expected: torch.Tensor


# $ORIGIN-relative build RUNPATHs (the shim beside the harness): a build made elsewhere (make
# gpu-carry's sm_90 prebuilt, docs/gpu-check.md) runs from another folder on the GPU machine
CMAKE_FLAGS = ("-DCMAKE_BUILD_RPATH_USE_ORIGIN=ON",)


def build_folder(build_dir: Path, archs: str, headers: Path) -> Path:
    """build_dir/<key>: the key hashes the archs, the TensorRT headers' contents (not their
    path, so a build keys the same on every machine) and the sources, not the folder."""
    digest = hashlib.sha256(f"{archs} {' '.join(CMAKE_FLAGS)}".encode())
    for header in sorted(Path(headers).glob("NvInfer*.h")):
        digest.update(header.name.encode() + header.read_bytes())
    sources = sorted((ROOT / "plugins").glob("CMakeLists.txt")) + \
        sorted((ROOT / "plugins" / "kernels").glob("*")) + \
        sorted((ROOT / "plugins" / "tensorrt").glob("*.[ch]*")) + \
        sorted(p for p in HERE.glob("*") if p.suffix in (".cpp", ".h", ".txt"))
    for path in sources:
        digest.update(path.read_bytes())
    return Path(build_dir) / digest.hexdigest()[:12]


def artifacts(out: Path) -> Dict[str, Path]:
    """The files a run needs from a build folder (all a prebuilt copy carries)."""
    return {"exe": out / "trt_harness", "library": out / "plugins" / "libirpe_trt_plugins.so",
            "static": out / "plugins" / "libirpe_trt_plugins_static.so",
            "shim": out / "shim" / "libnvinfer.so.11"}


def is_built(build_dir: Path, archs: str, headers: Path) -> bool:
    """Whether build() would find every artifact and build nothing (no cmake/nvcc needed)."""
    return all(p.is_file() for p in artifacts(build_folder(build_dir, archs, headers)).values())


def build(build_dir: Path, archs: str, headers: Path) -> Dict[str, object]:
    """Configure + build the harness and both plugin libraries under build_dir/<key>."""
    out = build_folder(build_dir, archs, headers)
    paths = artifacts(out)
    if all(p.is_file() for p in paths.values()):
        return {**paths, "seconds": 0.0}
    start = time.perf_counter()
    jobs = str(min(os.cpu_count() or 2, 8))
    for cmd in (["cmake", "-S", str(HERE), "-B", str(out), f"-DTENSORRT_ROOT={headers.parent}",
                 f"-DCMAKE_CUDA_ARCHITECTURES={archs}", *CMAKE_FLAGS],
                ["cmake", "--build", str(out), "-j", jobs, "--target", "trt_harness",
                 "irpe_trt_plugins", "irpe_trt_plugins_static"]):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            log = (proc.stdout + proc.stderr)[-4000:]
            raise RuntimeError(f"{' '.join(cmd[:2])} failed:\n{log}")
    return {**paths, "seconds": time.perf_counter() - start}


def _constants(model: onnx.ModelProto) -> Dict[str, torch.Tensor]:
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            values[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    return {k: torch.from_numpy(v.copy()) for k, v in values.items()}


def plugin_nodes(path: Path) -> List[Node]:
    """The irpe-domain nodes of an ONNX file, their attributes and constant index input."""
    model = onnx.shape_inference.infer_shapes(onnx.load(str(path)))
    consts = _constants(model)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in model.graph.value_info}
    return [Node(n.op_type, {a.name: helper.get_attribute_value(a) for a in n.attribute},
                 consts.get(n.input[1]), shapes.get(n.input[0], [0] * 4)[2:3] == [1])
            for n in model.graph.node if n.domain == "irpe"]


def export_deit_qkv(path: Path) -> Path:
    """A 1-block DeiT (5x5 patches + cls) with product iRPE on q, k, v, exported by export/."""
    from export.onnx import export_onnx
    from irpe import RPEConfig, create_model
    from irpe.artifact.trained import default_spec
    cfg = RPEConfig(ratio=1.9, method="product", mode="ctx", shared_head=True, skip=1, on="qkv")
    kw = dict(img_size=40, patch_size=8, embed_dim=32, depth=1, num_heads=HEADS, num_classes=10,
              rpe_config=cfg)
    model = create_model("deit_tiny_patch16_224", **kw).eval()
    spec = default_spec("deit_tiny_patch16_224", **kw)
    spec.preprocess["size"] = kw["img_size"]
    return Path(export_onnx(model, path, spec=spec))


def write_grid_onnx(path: Path) -> Path:
    """An ONNX file of on-the-fly nodes as a graph would carry them (export/ emits none)."""
    nodes = []
    for i, (method, ratio, skip, _, _) in enumerate(GRIDS):
        for op in ("RPEGatherGrid", "RPEScatterGrid"):
            nodes.append(helper.make_node(
                op, [f"x{i}", f"g{i}"], [f"{op}{i}"], domain="irpe", plugin_namespace="irpe",
                plugin_version="1", method=method, ratio=ratio, skip=skip,
                num_buckets=num_buckets(method, ratio, skip)))
    graph = helper.make_graph(nodes, "grid_nodes", [], [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", MIN_OPSET),
                                                     helper.make_opsetid("irpe", 1)])
    onnx.save(model, str(path))
    return path


def _tensor_line(kind: str, name: str, t: torch.Tensor, folder: Path, write: bool) -> str:
    dtype = next(k for k, v in DTYPES.items() if v == t.dtype)
    if write:
        (folder / name).write_bytes(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return f"{kind} {dtype} {t.dim()} {' '.join(map(str, t.shape))} {name}"


def _write_case(folder: Path, node: Node, inputs: Sequence[torch.Tensor],
                expected: torch.Tensor) -> Case:
    folder.mkdir(parents=True, exist_ok=True)
    lines = [f"node {node.op_type}"]
    for name, value in node.attrs.items():
        if isinstance(value, bytes):
            lines.append(f"attr {name} s {value.decode()}")
        elif isinstance(value, int):
            lines.append(f"attr {name} i {value}")
        else:
            lines.append(f"attr {name} f {float(value)!r}")
    lines += [_tensor_line("input", f"in{i}.bin", t, folder, True) for i, t in enumerate(inputs)]
    lines.append(_tensor_line("output", "out.bin", expected, folder, False))
    (folder / "case.txt").write_text("\n".join(lines) + "\n")
    return Case(folder, node.op_type, expected)


def _index_inputs(node: Node, dtype: torch.dtype, g: torch.Generator):
    index = node.index
    lq, lk = index.shape
    k = int(node.attrs["num_buckets"])
    if node.op_type == "RPEScatter":
        attn = torch.rand(BATCH, HEADS, lq, lk, generator=g).softmax(-1).to(dtype)
        return attn, rpe_scatter(attn, index.long(), k)
    rows = 1 if node.one_row else lq
    table = torch.randn(BATCH, HEADS, rows, k, generator=g).to(dtype)
    return table, rpe_gather(table, index.long())


def write_cases(folder: Path, deit_onnx: Path, grid_onnx: Path) -> List[Case]:
    """Every plugin node of both files x value dtype (x int64/int32 ids for index nodes)."""
    cases, g = [], torch.Generator().manual_seed(0)
    for n, node in enumerate(plugin_nodes(deit_onnx)):
        for vname in VALUE_DTYPES:
            for iname in ("int64", "int32"):
                x, expected = _index_inputs(node, DTYPES[vname], g)
                name = f"{node.op_type}{n}_{vname}_{iname}"
                cases.append(_write_case(folder / name, node,
                                         [x, node.index.to(DTYPES[iname])], expected))
    for n, node in enumerate(plugin_nodes(grid_onnx)):
        method, ratio, skip, gh, gw = GRIDS[n // 2]
        ids, k = bucket_ids(method, ratio, gh, gw, skip), int(node.attrs["num_buckets"])
        for vname in VALUE_DTYPES:
            dtype = DTYPES[vname]
            grid = torch.randn(BATCH, 3, gh, gw, generator=g).to(dtype)  # only its dims are read
            if node.op_type == "RPEGatherGrid":
                x = torch.randn(BATCH, HEADS, ids.shape[0], k, generator=g).to(dtype)
                expected = rpe_gather(x, ids)
            else:
                x = torch.rand(BATCH, HEADS, *ids.shape, generator=g).softmax(-1).to(dtype)
                expected = rpe_scatter(x, ids, k)
            cases.append(_write_case(folder / f"{node.op_type}_{method}{n // 2}_{vname}", node,
                                     [x, grid], expected))
    return cases


def run(build: Dict[str, object], how: str, cases: Sequence[Case], device: bool,
        timeout: float = 300) -> Tuple[subprocess.CompletedProcess, int, int]:
    """Run the harness on ``cases`` with the dynamic or static library:
    (process, checks passed, checks failed)."""
    library = build["library"] if how == "dynamic" else build["static"]
    cmd = [str(build["exe"]), "--library", str(library), "--load", how]
    cmd += ([] if device else ["--no-device"]) + [str(c.folder) for c in cases]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    found = re.search(r"^(\d+) passed, (\d+) failed$", proc.stdout, re.M)
    passed, failed = (int(found.group(1)), int(found.group(2))) if found else (0, -1)
    return proc, passed, failed


def output_of(case: Case) -> torch.Tensor:
    """The harness's output of ``case`` (written by a device run)."""
    data = bytearray((case.folder / "out.bin").read_bytes())
    flat = torch.frombuffer(data, dtype=torch.uint8).view(case.expected.dtype)
    return flat.reshape(case.expected.shape)


def assert_matches_reference(case: Case) -> None:
    """Gathers copy values: bitwise equal. Scatters sum in fp32: within SCATTER_TOL."""
    got = output_of(case)
    if "Gather" in case.op_type:
        assert torch.equal(got, case.expected), case.folder.name
    else:
        tol = SCATTER_TOL[case.expected.dtype]
        torch.testing.assert_close(got.double(), case.expected.double(), rtol=tol, atol=tol,
                                   msg=lambda m: f"{case.folder.name}: {m}")
