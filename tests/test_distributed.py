"""torchrun (2 processes, gloo, CPU) against one process with the same global batch.

The comparison is exact: the one-process reference accumulates two micro-batches of the same
size (``--grad-accum-steps 2``), so both runs add the same two partial gradients. The sampler
deals each global batch to processes x micro-batches slots alike (slot s: samples s, s + S,
...), the flip coins of the whole global batch come from one generator every process keeps in
step, and the DETR loss normalisers are integer counts of the whole step. Each micro-batch's
forward and backward are the same kernels on the same inputs in either run; DDP scales by
1 / processes and accumulation by 1 / micro-batches (both 1/2, exact in binary floating point)
before one addition of the two partial gradients, which is commutative. So the weights are
bit-identical on any CPU and vector width.

Why not one process with one batch of 8: its GEMMs sum the 8 samples in another order, and
AdamW divides each coordinate by its own gradient RMS, so where the gradient is zero in exact
arithmetic (the key bias and the last block's cls-row rpe_k bucket: softmax is shift-invariant)
rounding noise becomes lr-sized steps whose size depends on the CPU's vector width (a fixed
1e-5 bound held on AVX2 and failed on AVX-512 with 1.19e-5; docs/training.md). The tiny config
removes what is per process by design: drop-path 0, no mixup, BatchNorm frozen (``--freeze-bn``
for the classifier; ``--init`` gives DETR its frozen-BN backbone).
"""
import json
import os
import subprocess
import sys

import pytest
import torch

from irpe.cli import main
from irpe.training.train import TrainConfig, train

DEMO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "irpe", "demo"))
CLS = ["--model", "deit_shapes_irpe", "--data", "shapes", "--epochs", "2", "--shapes-train", "32",
       "--shapes-val", "15", "--init", os.path.join(DEMO, "deit_shapes_irpe.safetensors"),
       "--freeze-bn", "--drop-path", "0", "--lr", "1e-4", "--threads", "1", "--no-progress",
       "--device", "cpu"]
DET = ["--model", "detr_shapes_irpe", "--data", "shapes", "--epochs", "1", "--shapes-train", "8",
       "--shapes-val", "5", "--init", os.path.join(DEMO, "detr_shapes_irpe.safetensors"),
       "--lr", "1e-5", "--lr-backbone", "1e-5", "--max-steps", "2", "--threads", "1",
       "--no-progress", "--device", "cpu"]
RUN_FILES = {"log.jsonl", "last.pt", "model.safetensors"}


def torchrun(*args: str, procs: int = 2, ok: bool = True) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc-per-node N -m irpe ARGS`` (a real launch, gloo on CPU)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    if sys.platform.startswith("linux"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # one machine: no hostname lookup needed
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={procs}", "-m", "irpe", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300,
                         cwd=os.path.join(os.path.dirname(__file__), ".."))
    if ok:
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def single(argv, tmp, **kw) -> str:
    """The same training in this process (no torch.distributed); returns its last.pt."""
    from irpe.training.cli import RECIPES, TASK_NAMES
    task = TASK_NAMES[argv[0]]
    values = dict(RECIPES[task], task=task, output=str(tmp), progress=False)
    it = iter(argv[1:])
    for flag in it:
        key = flag[2:].replace("-", "_")
        if key == "freeze_bn":
            values[key] = True
        elif key != "no_progress":
            value = next(it)
            values[key] = value if key in ("model", "data", "init", "device") else float(value)
    for key in ("epochs", "shapes_train", "shapes_val", "max_steps", "threads", "batch_size",
                "grad_accum_steps"):
        if key in values:
            values[key] = int(values[key])
    values.update(kw)
    train(TrainConfig(**values))
    return os.path.join(tmp, "last.pt")


def weights(path):
    return torch.load(path, map_location="cpu", weights_only=True)["model"]


def max_diff(a, b) -> float:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    return max(float((wa[k].double() - wb[k].double()).abs().max()) for k in wa)


def log_lines(run):
    return [json.loads(x) for x in open(os.path.join(run, "log.jsonl")).read().splitlines()]


@pytest.fixture(scope="module")
def cls_runs(tmp_path_factory):
    """2-process classification: interrupted after 3 steps, resumed; and a straight run."""
    d = tmp_path_factory.mktemp("dist")
    cut, resumed, straight = str(d / "cut"), str(d / "resumed"), str(d / "straight")
    out_cut = torchrun("train", "cls", *CLS, "--batch-size", "4", "--output", cut,
                       "--max-steps", "3")
    cut_state = torch.load(os.path.join(cut, "last.pt"), weights_only=True)
    os.makedirs(resumed)
    os.replace(os.path.join(cut, "last.pt"), os.path.join(resumed, "cut.pt"))
    out_res = torchrun("train", "cls", *CLS, "--batch-size", "4", "--output", resumed,
                       "--resume", os.path.join(resumed, "cut.pt"))
    torchrun("train", "cls", *CLS, "--batch-size", "4", "--output", straight)
    return dict(dir=d, cut=cut, cut_state=cut_state, resumed=resumed, straight=straight,
                out_cut=out_cut, out_res=out_res)


def test_two_processes_equal_one_process_with_the_same_global_batch(cls_runs, tmp_path):
    accum = ["--batch-size", "4", "--grad-accum-steps", "2"]  # global batch 8, as 2 x 4
    one = single(["cls", *CLS, *accum, "--max-steps", "3"], tmp_path / "one3")
    state = cls_runs["cut_state"]
    assert (state["step"], state["epoch"], state["epoch_step"], state["processes"]) == (3, 0, 3, 2)
    assert torch.load(one, weights_only=True)["global_batch"] == state["global_batch"] == 8
    wa, wb = weights(one), state["model"]
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)  # bit-identical after 3 steps
    full = single(["cls", *CLS, *accum], tmp_path / "one")
    assert max_diff(full, os.path.join(cls_runs["straight"], "last.pt")) == 0.0  # 8 steps
    # another world size: the 2-process run cut after 3 steps, finished by one process
    other = single(["cls", *CLS, *accum], tmp_path / "other",
                   resume=os.path.join(cls_runs["resumed"], "cut.pt"))
    assert max_diff(other, full) == 0.0
    assert log_lines(tmp_path / "other")[0]["processes"] == 1
    # the same figures in the log: validation is sharded 8 + 7 and summed exactly
    one_log, two_log = log_lines(tmp_path / "one"), log_lines(cls_runs["straight"])
    assert [r["val_images"] for r in two_log] == [15, 15]
    assert [r["val_top1"] for r in two_log] == [r["val_top1"] for r in one_log]
    assert [r["train_loss"] for r in two_log] == [r["train_loss"] for r in one_log]
    assert two_log[0]["global_batch"] == one_log[0]["global_batch"] == 8
    assert (two_log[0]["processes"], one_log[0]["processes"]) == (2, 1)


def test_one_batch_of_eight_differs_from_two_of_four_only_by_rounding(cls_runs, tmp_path):
    """The same global batch as one micro-batch: equal up to float rounding wherever the
    gradient is not zero in exact arithmetic. Compared as the model's function (the logits
    on the validation images), which the zero-gradient directions do not change: the logit
    difference must stay orders of magnitude below what the training moved the logits."""
    from irpe.artifact.trained import default_spec
    from irpe.data.datasets import ShapesClassification
    from irpe.models import create_model
    one = single(["cls", *CLS, "--batch-size", "8"], tmp_path / "one8")
    models = {}
    for name, path in (("one", one), ("two", os.path.join(cls_runs["straight"], "last.pt"))):
        m = create_model("deit_shapes_irpe", num_classes=8).eval()
        m.load_state_dict(weights(path))
        models[name] = m
    start = create_model("deit_shapes_irpe", num_classes=8,
                         checkpoint=os.path.join(DEMO, "deit_shapes_irpe.safetensors")).eval()
    tf = default_spec("deit_shapes_irpe").transform()
    data = ShapesClassification(15, 0, tf.size, tf, split="val")
    images = torch.stack([data[i][0] for i in range(len(data))])
    with torch.no_grad():
        lo, lt, l0 = models["one"](images), models["two"](images), start(images)
    moved, apart = float((lo - l0).abs().max()), float((lo - lt).abs().max())
    print(f"logits moved by training {moved:.3g}, 1 x 8 vs 2 x 4 apart {apart:.3g}")
    # Bound: float32 rounding of a sum of n terms is at most n * 2**-24 relative (n = 8 images
    # x 65 tokens = 520 in the longest gradient reduction), 8 steps -> <= 2.5e-4 of the move;
    # a wrong split (one image or flip of 8 another) moves the function by ~1/8 of it.
    assert moved > 1e-3 and apart < 1e-3 * moved


def test_resumed_two_process_run_continues_exactly(cls_runs):
    resumed = os.path.join(cls_runs["resumed"], "last.pt")
    assert max_diff(resumed, os.path.join(cls_runs["straight"], "last.pt")) == 0.0
    lines = log_lines(cls_runs["resumed"])
    assert [(r["epoch"], r["step"]) for r in lines] == [(1, 4), (2, 8)]
    assert "global batch 8 = 4 per process x 2" in cls_runs["out_res"].stdout


def test_rank_zero_writes_each_file_once(cls_runs):
    for name in ("cut", "straight"):
        run = cls_runs[name]
        assert set(os.listdir(run)) <= RUN_FILES and "log.jsonl" in os.listdir(run)
    lines = log_lines(cls_runs["straight"])
    assert [r["epoch"] for r in lines] == [1, 2]  # one line per epoch, not one per rank
    cut_log = log_lines(cls_runs["cut"])
    assert len(cut_log) == 1 and cut_log[0]["partial"] and cut_log[0]["step"] == 3
    out = cls_runs["out_cut"].stdout
    assert out.count("done: ") == 1 and out.count("distributed: 2 processes (gloo)") == 1
    assert "before epoch 1 completed" in out  # stopped by --max-steps 3 of 4: provisional


def test_sharded_eval_under_torchrun_equals_one_process(cls_runs, tmp_path, capsys):
    model = os.path.join(cls_runs["straight"], "model.safetensors")
    two, one = str(tmp_path / "two.json"), str(tmp_path / "one.json")
    args = ["eval", model, "--data", "shapes", "--shapes-val", "15", "--threads", "1",
            "--device", "cpu", "--batch-size", "4"]
    out = torchrun(*args, "--json", two)
    assert out.stdout.count("top1") == 1  # rank 0 prints
    assert main([*args, "--json", one]) == 0
    m2, m1 = json.load(open(two))["metrics"], json.load(open(one))["metrics"]
    assert m2["images"] == m1["images"] == 15  # 8 + 7 images, no padded duplicate counted
    assert m2["top1"] == m1["top1"] and m2["top5"] == m1["top5"]
    assert m2["loss"] == pytest.approx(m1["loss"], rel=1e-5)


def test_detection_two_processes_equal_one_process(tmp_path):
    two = str(tmp_path / "two")
    out = torchrun("train", "det", *DET, "--batch-size", "2", "--output", two)
    one = single(["det", *DET, "--batch-size", "2", "--grad-accum-steps", "2"], tmp_path / "one")
    assert max_diff(one, os.path.join(two, "last.pt")) == 0.0  # bit-identical after 2 steps
    (rec2,), (rec1,) = log_lines(two), log_lines(tmp_path / "one")
    assert rec2["val_images"] == rec1["val_images"] == 5  # gathered on rank 0: 3 + 2 images
    assert rec2["val_AP50"] == pytest.approx(rec1["val_AP50"], abs=1e-6)
    assert set(os.listdir(two)) == RUN_FILES and out.stdout.count("done: best") == 1


def test_distributed_rejects_bad_input(monkeypatch):
    from irpe.training.distributed import resolve_device, setup
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="WORLD_SIZE='two' is not an integer"):
        setup("cpu")
    with pytest.raises(ValueError, match="--device must be"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda", 0, 2)
    with pytest.raises(ValueError, match="grad_accum_steps must be >= 1"):
        TrainConfig(task="classification", model="deit_shapes_irpe", data="shapes", output="o",
                    grad_accum_steps=0)
    with pytest.raises(ValueError, match="dist_timeout"):
        TrainConfig(task="classification", model="deit_shapes_irpe", data="shapes", output="o",
                    dist_timeout=0)


def test_a_rank_that_dies_ends_the_job_with_its_error(tmp_path):
    """Rank 1 alone meets an unreadable val image (the shard of odd indices): the job ends."""
    from irpe.data.datasets import ImageFolder
    from irpe.data.shapes import write_classification
    data = tmp_path / "data"
    write_classification(str(data), num_train=16, num_val=16)
    bad = ImageFolder(str(data / "val")).samples[1][0]  # index 1: rank 1's first image
    with open(bad, "wb") as fh:
        fh.write(b"not an image")
    run = tmp_path / "run"
    out = torchrun("train", "cls", "--model", "deit_shapes_irpe", "--data", str(data),
                   "--output", str(run), "--batch-size", "4", "--max-steps", "1",
                   "--threads", "1", "--no-progress", "--device", "cpu", "--dist-timeout", "120",
                   ok=False)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "irpe train: error: cannot decode image" in text  # rank 1's own message
    assert "rank      : 1" in text  # torchrun names the failed rank
    assert torch.load(run / "last.pt", weights_only=True)["step"] == 1  # written before eval
