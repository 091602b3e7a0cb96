"""torch.distributed glue for ``irpe train`` / ``irpe eval`` launched by torchrun (env://).

One process per device; NCCL on CUDA, gloo on CPU. A run without torchrun's environment
(``WORLD_SIZE`` unset or 1) gets :data:`SINGLE`, whose collectives are identities, so
single-process code paths never touch torch.distributed.
"""
from __future__ import annotations

import datetime
import itertools
import os
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch
from torch.utils.data import Sampler

from ..errors import InvalidInput

__all__ = ["Dist", "SINGLE", "setup", "resolve_device", "ShardSampler", "ResumableSampler",
           "batches"]

DEFAULT_TIMEOUT_S = 600.0  # a collective waiting longer than this (a dead peer) fails the job


def batches(loader: Iterable) -> Iterator:
    """``iter(loader)`` with Ctrl-C held while it starts (irpe.atomic.held_interrupts): a
    DataLoader with workers forks them there, and a KeyboardInterrupt raised in the middle was
    swallowed by a fork hook (training went on) or left a half-made iterator whose clean-up
    printed an AttributeError. Held, the Ctrl-C arrives once the workers run, and they (forked
    while it is held) leave it to this process, which stops them as it unwinds."""
    from ..atomic import held_interrupts
    with held_interrupts():
        return iter(loader)


@dataclass(frozen=True)
class Dist:
    """This process's place in the job and the few collectives the engine needs."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    backend: str = ""

    @property
    def main(self) -> bool:
        return self.rank == 0

    def _device(self) -> torch.device:
        # NCCL reduces CUDA tensors only; gloo CPU tensors
        return torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" \
            else torch.device("cpu")

    def all_sum(self, values: Sequence[float]) -> List[float]:
        """Element-wise sum over all ranks (float64, so integer counts stay exact)."""
        if self.world == 1:
            return [float(v) for v in values]
        import torch.distributed as dist
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self._device())
        dist.all_reduce(t)
        return t.cpu().tolist()

    def gather(self, obj: Any) -> Optional[List[Any]]:
        """Every rank's ``obj`` as a list on rank 0 (None elsewhere)."""
        if self.world == 1:
            return [obj]
        import torch.distributed as dist
        out = [None] * self.world if self.main else None
        dist.gather_object(obj, out, dst=0)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if self.world == 1:
            return obj
        import torch.distributed as dist
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]


SINGLE = Dist()


def resolve_device(name: str, local_rank: int = 0, world: int = 1) -> str:
    """'auto' | 'cpu' | 'cuda[:N]' -> a device string; under torchrun CUDA means cuda:LOCAL_RANK."""
    if name in ("auto", None):
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise InvalidInput("--device cuda requested but CUDA is not available")
        if world > 1:
            if ":" in name:
                raise InvalidInput("under torchrun give --device cuda (each process takes "
                                   "cuda:LOCAL_RANK), not a device index")
            return f"cuda:{local_rank}"
    elif name != "cpu":
        raise InvalidInput(f"--device must be auto, cpu, cuda or cuda:N, got {name!r}")
    return name


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    try:
        return default if value in (None, "") else int(value)
    except ValueError:
        raise InvalidInput(f"environment variable {name}={value!r} is not an integer") from None


def setup(device: str = "auto", timeout_s: float = DEFAULT_TIMEOUT_S) -> Tuple[Dist, str]:
    """Join torchrun's process group when WORLD_SIZE > 1; returns (Dist, device string)."""
    world = _env_int("WORLD_SIZE", 1)
    if world <= 1:
        return SINGLE, resolve_device(device)
    rank, local_rank = _env_int("RANK", 0), _env_int("LOCAL_RANK", 0)
    dev = resolve_device(device, local_rank, world)
    import torch.distributed as dist
    backend = "nccl" if dev.startswith("cuda") else "gloo"
    if dev.startswith("cuda"):
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend, init_method="env://", world_size=world, rank=rank,
                                timeout=datetime.timedelta(seconds=timeout_s))
    return Dist(rank, world, local_rank, dist.get_backend()), dev


def teardown(d: Dist, meet: bool = True) -> None:
    """Leave the process group (end of a torchrun job). With ``meet`` (a job that ended well)
    all ranks meet first: a gloo rank that destroys its group while a peer is still working
    (rank 0 writing checkpoints) can abort at exit ("terminate called without an active
    exception", seen once in a full test run). A failing rank leaves at once (no barrier that
    would hold it until the timeout)."""
    if d.world > 1:
        import torch.distributed as dist
        if dist.is_initialized():
            if meet:
                dist.barrier()
            dist.destroy_process_group()


class ShardSampler(Sampler):
    """Indices rank, rank + world, ... of range(n): every sample exactly once over all ranks.

    Unlike DistributedSampler nothing is padded, so reduced metrics count no duplicates.
    """

    def __init__(self, n: int, d: Dist = SINGLE) -> None:
        self.indices = range(d.rank, n, d.world)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


class ResumableSampler(Sampler):
    """This process's micro-batches of a seed + epoch shuffle (drop_last), resumable mid-epoch.

    Each global batch is dealt to ``world x accum`` slots the way DistributedSampler deals it to
    ranks: slot s takes samples s, s + S, ... of it. Process ``rank`` owns the slots
    ``rank * accum + k`` (k < accum) and yields, step after step, one micro-batch of
    ``batch_size`` samples per slot in k order. So 2 processes x 1 micro-batch and 1 process x 2
    accumulated micro-batches see exactly the same samples in the same micro-batches.
    """

    def __init__(self, n: int, d: Dist, seed: int, batch_size: int = 1,
                 accum: int = 1) -> None:
        from torch.utils.data import DistributedSampler
        slots = d.world * accum
        # DistributedSampler needs no process group when rank and world are given
        # torch types the data set as a Dataset; the sampler only takes its len()
        self.inner: List[DistributedSampler[int]] = [
            DistributedSampler(range(n), num_replicas=slots,  # type: ignore[arg-type]
                               rank=d.rank * accum + k, shuffle=True, seed=seed, drop_last=True)
            for k in range(accum)]
        self.batch_size, self.start = batch_size, 0
        self.steps = len(self.inner[0]) // batch_size  # whole global batches per epoch

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """This epoch's order; skip the first ``start`` samples of this process (a resumed
        epoch: steps done x batch_size x accum)."""
        for inner in self.inner:
            inner.set_epoch(epoch)
        self.start = start

    def _order(self) -> Iterator[int]:
        b = self.batch_size
        slots = [list(inner) for inner in self.inner]
        for step in range(self.steps):
            for slot in slots:
                yield from slot[step * b:(step + 1) * b]

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(self._order(), self.start, None)

    def __len__(self) -> int:
        return self.steps * self.batch_size * len(self.inner) - self.start
