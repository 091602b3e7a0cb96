"""The server on Ray Serve across a local multi-node Ray cluster: throughput and node loss.

``python -m benchmarks.ray_serve`` (needs ``pip install 'irpe-deploy[ray]'``):

1. **Throughput**: the demo classifier behind ``irpe serve`` (one process, ``--threads`` =
   the cores) vs 2 Ray Serve replicas on a 2-node local cluster (one raylet per node, 1 CPU
   each, one inference thread per replica) through Ray's HTTP proxy, the same closed-loop
   clients against each; the two alternate (each started, measured and stopped in turn), so
   neither runs beside the other. The ratio counts the proxy hop, it does not assume it.
2. **Node loss**: ``--tries`` times a fresh 2-node cluster with 2 replicas, 32 clients, the
   worker node killed (SIGKILL, no graceful stop) mid-run; every request's outcome is counted
   (status, or no answer within ``--request-timeout-s``), failures sent after the kill
   separately, and the seconds until throughput is back to half its pre-kill rate.

The cluster and the load generator here are also the tests' (tests/test_ray_serve.py).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from benchmarks.rawhttp import LeanClient, Lost
from benchmarks.serve_load import png, server_process, write_repository

__all__ = ["Outcome", "LoadRun", "free_port", "local_cluster", "closed_loop", "launch_demo",
           "recovery_s", "finish_report", "main"]

# Ray's processes inherit these from the driver that starts the cluster: replicas report their
# ongoing requests every 0.5 s (Ray's default: 10 s), so autoscaling acts in seconds; the one
# proxy (on the head node) routes to every node's replicas, not to its own node's first
# (Ray's default with a proxy per node behind a load balancer)
CLUSTER_ENV = {"RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "0.5",
               "RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "0.5",
               "RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING": "0"}


@dataclass
class Outcome:
    """One request: when it was sent and answered (seconds from the run's start), and its
    status code, or ``lost`` (connection failed) / ``timeout`` (no answer in time)."""

    sent: float
    done: float
    status: Any


@dataclass
class LoadRun:
    """Every request of a closed-loop run, and the events marked during it."""

    outcomes: List[Outcome] = field(default_factory=list)
    events: Dict[str, float] = field(default_factory=dict)
    stopped: bool = False  # set (by ``during``) to end the run before its seconds are up

    def counts(self) -> Counter:
        return Counter(str(o.status) for o in self.outcomes)

    def per_second(self, ok: int = 200) -> Dict[int, int]:
        """Answers with status ``ok`` by the second they came back in."""
        out: Counter = Counter(int(o.done) for o in self.outcomes if o.status == ok)
        return dict(sorted(out.items()))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def local_cluster(nodes: int = 2, cpus_per_node: int = 1, port: Optional[int] = None,
                  ingress: str = "proxy") -> Iterator[Tuple[Any, List[Any], int]]:
    """A Ray cluster of ``nodes`` raylets on this host (the head + workers), this process its
    driver, Serve started with its HTTP ``ingress`` (RaySettings.ingress) on the head node only
    at 127.0.0.1:``port``; yields (cluster, worker nodes, port) and tears everything down
    after."""
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    from serve.ray_settings import RaySettings
    os.environ.update({**CLUSTER_ENV, **RaySettings(ingress=ingress).node_env()})
    port = port or free_port()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": cpus_per_node, "include_dashboard": False})
    workers = [cluster.add_node(num_cpus=cpus_per_node) for _ in range(nodes - 1)]
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1",
                                                             "port": port})
        yield cluster, workers, port
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()
        cluster.shutdown()


def launch_demo(ray: Dict[str, Any], **overrides: Any) -> Tuple[Any, Any]:
    """(Launch, settings) of the demo classifier and detector on ONNX Runtime (as the
    irpe serve side of the benchmark) with this ``ray:`` section."""
    from serve.launch import Launch
    launch = Launch(backend="onnxruntime",
                    overrides={"ray": ray, "log_level": "warning", **overrides})
    return launch, launch.settings(default_threads=1)


async def closed_loop(url: str, path: str, body: bytes, headers: Dict[str, str],
                      clients: int, seconds: float, timeout_s: float = 30.0,
                      during: Optional[Callable[[LoadRun, float], Any]] = None) -> LoadRun:
    """``clients`` request-after-response loops for ``seconds``, every outcome recorded; a
    request without an answer in ``timeout_s`` counts as ``timeout`` (a hang, never waited
    out). ``during(run, start)``, when given, runs beside the load (e.g. kills a node)."""
    client = LeanClient(url, path, body, headers, keepalive_s=60.0, max_connections=clients)
    run = LoadRun()
    start = time.perf_counter()

    async def worker() -> None:
        while (sent := time.perf_counter() - start) < seconds and not run.stopped:
            try:
                status, _ = await asyncio.wait_for(client.post(), timeout_s)
            except Lost:
                status = "lost"
            except asyncio.TimeoutError:
                status = "timeout"
            run.outcomes.append(Outcome(sent, time.perf_counter() - start, status))

    tasks = [worker() for _ in range(clients)]
    if during is not None:
        tasks.append(during(run, start))
    await asyncio.gather(*tasks)
    await client.aclose()
    return run


def recovery_s(run: LoadRun, event: str, fraction: float = 0.5) -> Optional[float]:
    """Seconds from ``event`` to the first whole second after it whose 200s reach
    ``fraction`` of the median per-second rate before it (None: never)."""
    at = run.events[event]
    rates = run.per_second()
    before = [n for s, n in rates.items() if 1 <= s < int(at)]
    if not before:
        return None
    want = fraction * statistics.median(before)
    for second in range(int(at) + 1, max(rates, default=0) + 1):
        if rates.get(second, 0) >= want:
            return second - at
    return None


async def kill_node_at(cluster: Any, node: Any, at_s: float, run: LoadRun,
                       start: float) -> None:
    """Kill ``node`` (SIGKILL of its raylet and workers) ``at_s`` seconds into the run."""
    await asyncio.sleep(max(0.0, at_s - (time.perf_counter() - start)))
    run.events["kill"] = time.perf_counter() - start
    await asyncio.to_thread(cluster.remove_node, node, False)
    run.events["killed"] = time.perf_counter() - start


# ------------------------------------------------------------------ python -m benchmarks.ray_serve

def _image_request() -> Tuple[bytes, Dict[str, str]]:
    return png(64), {"Content-Type": "image/png"}


def _irpe_serve_rate(folder: Path, threads: int, clients: int, seconds: float) -> Dict:
    from serve.demo import demo_models
    cfg = demo_models("onnxruntime")[0]
    repo = write_repository(folder, [{"name": cfg.name, "path": cfg.path,
                                      "backend": "onnxruntime", "max_queue_size": 1024}])
    body, headers = _image_request()
    with server_process(repo, threads) as url:
        asyncio.run(closed_loop(url, "/v1/classify", body, headers, clients, 2.0))  # warm
        run = asyncio.run(closed_loop(url, "/v1/classify", body, headers, clients, seconds))
    return _rate(run, seconds)


def _ray_rate(ingress: str, clients: int, seconds: float) -> Dict:
    from serve.ray_app import deploy
    body, headers = _image_request()
    with local_cluster(2, 1, ingress=ingress) as (_, _, port):
        launch, settings = launch_demo({"num_replicas": 2, "max_ongoing_requests": 64})
        deploy(launch, settings)
        url = f"http://127.0.0.1:{port}"
        asyncio.run(closed_loop(url, "/v1/classify", body, headers, clients, 2.0))
        run = asyncio.run(closed_loop(url, "/v1/classify", body, headers, clients, seconds))
    return _rate(run, seconds)


def _rate(run: LoadRun, seconds: float) -> Dict:
    ok = [o for o in run.outcomes if o.status == 200]
    lat = sorted(o.done - o.sent for o in ok)
    return {"req_s": len(ok) / seconds, "errors": len(run.outcomes) - len(ok),
            "p50_ms": 1e3 * lat[len(lat) // 2] if lat else None}


def node_loss_try(ingress: str, clients: int, seconds: float, kill_at_s: float,
                  timeout_s: float) -> Dict:
    """One try: 2 nodes, 2 replicas, ``clients`` clients, the worker killed at ``kill_at_s``."""
    from serve.ray_app import deploy
    body, headers = _image_request()
    with local_cluster(2, 1, ingress=ingress) as (cluster, (worker,), port):
        launch, settings = launch_demo({"num_replicas": 2, "max_ongoing_requests": 64})
        deploy(launch, settings)
        url = f"http://127.0.0.1:{port}"
        asyncio.run(closed_loop(url, "/v1/classify", body, headers, clients, 2.0))
        run = asyncio.run(closed_loop(
            url, "/v1/classify", body, headers, clients, seconds, timeout_s,
            during=lambda r, s: kill_node_at(cluster, worker, kill_at_s, r, s)))
    return node_loss_row(run)


def node_loss_row(run: LoadRun) -> Dict:
    """Counts of a node-loss run: failed requests, those sent after the kill finished, hangs,
    and the recovery time."""
    failed = [o for o in run.outcomes if o.status != 200]
    after = [o for o in failed if o.sent > run.events["killed"]]
    return {"requests": len(run.outcomes), "failed": len(failed),
            "failed_sent_after_kill": len(after), "statuses": dict(run.counts()),
            "timeouts": sum(o.status == "timeout" for o in run.outcomes),
            "kill_s": round(run.events["kill"], 2), "recovery_s": recovery_s(run, "killed"),
            "max_latency_s": round(max(o.done - o.sent for o in run.outcomes), 2)}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ray_serve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--seconds", type=float, default=15.0, help="per throughput measurement")
    p.add_argument("--rounds", type=int, default=3, help="throughput: alternations")
    p.add_argument("--tries", type=int, default=3, help="node-loss runs")
    p.add_argument("--kill-at-s", type=float, default=6.0)
    p.add_argument("--node-loss-seconds", type=float, default=20.0)
    p.add_argument("--request-timeout-s", type=float, default=30.0)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2,
                   help="irpe serve's threads (the cores the 2 replicas share)")
    p.add_argument("--out", type=Path, help="write the report (Markdown) here too")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    ingresses = ("proxy", "haproxy")
    lines = [f"# Ray Serve (2 nodes x 1 CPU, 2 replicas) vs irpe serve ({args.threads} "
             f"threads), demo classifier, {args.clients} clients, one PNG per request", "",
             "req/s (p50 ms); ratio = Ray Serve / irpe serve of the same round", "",
             "| round | irpe serve | Ray, proxy ingress | ratio | Ray, haproxy ingress | ratio |",
             "|---|---|---|---|---|---|"]
    ratios: Dict[str, List[float]] = {i: [] for i in ingresses}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            plain = _irpe_serve_rate(Path(tmp), args.threads, args.clients, args.seconds)
            cells = [f"{plain['req_s']:.1f} ({plain['p50_ms']:.1f})"]
            for ingress in ingresses:
                row = _ray_rate(ingress, args.clients, args.seconds)
                ratios[ingress].append(row["req_s"] / plain["req_s"])
                cells += [f"{row['req_s']:.1f} ({row['p50_ms']:.1f})",
                          f"{ratios[ingress][-1]:.3f}"]
            lines.append(f"| {r + 1} | " + " | ".join(cells) + " |")
            print(lines[-1], flush=True)
    lines += ["", "median ratio (goal >= 0.8): " + ", ".join(
        f"{i} ingress **{statistics.median(v):.3f}**" for i, v in ratios.items()), "",
              f"## Node loss: {args.clients} clients, the worker node SIGKILLed at "
              f"{args.kill_at_s} s of {args.node_loss_seconds} s", "",
              "| ingress | try | requests | failed | failed, sent after the kill | timeouts "
              "| statuses | recovery s | max latency s |", "|---|---|---|---|---|---|---|---|---|"]
    for ingress in ingresses:
        for t in range(args.tries):
            row = node_loss_try(ingress, args.clients, args.node_loss_seconds, args.kill_at_s,
                                args.request_timeout_s)
            recovery = "never" if row["recovery_s"] is None else f"{row['recovery_s']:.2f}"
            lines.append(f"| {ingress} | {t + 1} | {row['requests']} | {row['failed']} | "
                         f"{row['failed_sent_after_kill']} | {row['timeouts']} | "
                         f"{row['statuses']} | {recovery} | {row['max_latency_s']} |")
            print(lines[-1], flush=True)
    finish_report(lines, args.out)
    return 0


def finish_report(lines: List[str], out: Optional[Path]) -> None:
    """The Markdown report printed, and written to ``out`` (atomically) when given."""
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        from irpe.atomic import write_text
        write_text(out, text)


if __name__ == "__main__":
    raise SystemExit(main())
