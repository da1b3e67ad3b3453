"""Per-rank peak memory of PyTorch training the model of layout_memory.py: a reference for mf.

The model is `transformers.Qwen3ForCausalLM` at 127M parameters, as in layout_memory.py
(hidden 1024, 8 layers, 16 heads / 8 key-value heads, head dim 64, MLP 2816, vocabulary
32000, tied embedding, float32, attention `sdpa`), AdamW (lr 1e-4, betas (0.9, 0.95), eps 1e-8,
weight decay 0.1, not on the norms, as mf), `clip_grad_norm_(1.0)`, sequence 128, global batch
4 of random token ids (seeded; the same batches in every layout, each rank takes its slice of
4 / ranks sequences, one micro-batch), 2 steps, `torch.set_num_threads(1)` (`--threads`) in
every rank and in the one process. Layouts (`--runs`, `layout:ranks`):

- **single**: one process, batch 4, no torch.distributed;
- **fsdp2**: `torch.distributed.fsdp.fully_shard` on each decoder layer, then on the root
  model (torchtitan's way, reshard_after_forward True), on a CPU device mesh; gradients
  clipped as torchtitan does (`get_total_norm`, `full_tensor`, `clip_grads_with_norm_`);
- **fsdp2_meta**: the same, the model built on the meta device, sharded, then allocated
  (`to_empty`) and initialised shard by shard (Hugging Face's `_init_weights`, each rank's
  shards drawn from its own generator, so its losses differ a little from the others');
- **fsdp1**: `FullyShardedDataParallel` (FULL_SHARD, use_orig_params, one unit per decoder
  layer; `device_id=cpu`, without which torch 2.13 refuses: "FSDP needs a non-CPU accelerator
  device"), clipped with its `clip_grad_norm_`;
- **ddp**: `DistributedDataParallel`, every rank a full replica.

Except in fsdp2_meta, every rank builds the whole model from the same seed before it is
wrapped, so the built peak holds one full copy of the parameters. Ranks use process group
backend gloo on 127.0.0.1 and are started by `torch.multiprocessing.spawn` from a launcher
process (this file with `--worker`); a run past `--timeout` is killed, the launcher and every
process it started, by PID.

Per rank, the largest of the ranks reported:

- **built**: the peak once the model is wrapped and the optimizer exists, before the first
  step (AdamW's state does not exist yet: PyTorch creates it in the first `step`);
- **training**: the peak over the whole process, steps included;

each measured two ways: psutil polling each rank process's resident memory every 0.2 s (from
this process; may miss short peaks), and `ru_maxrss` read by the rank itself (Linux keeps the
high-water mark across `exec`, so a spawned rank's figure is at least the launcher's resident
memory when it spawned: the launcher imports torch only, and its polled peak is printed).
The **import floor** row is a process that imports torch and transformers and builds nothing.
The ratio is each run's training peak over the one process's. The loss of each step (the
mean over ranks) and the gradient norm before clipping are printed too: the same batches and,
but in fsdp2_meta, the same initial weights, so they should agree across layouts up to float
rounding. `exit` is the launcher's exit code: a run whose ranks all reported keeps its
figures even if a rank then failed (one fsdp2_meta run's rank aborted in gloo's teardown,
"terminate called without an active exception", after its report).
Usage: python benchmarks/torch_fsdp_memory.py [--runs single:1,fsdp2:2,fsdp2:4,...]
       [--threads 1] [--timeout 600]
(torch 2.13.0 CPU, transformers 4.57.6 and psutil installed.)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MODEL = {"vocab_size": 32000, "hidden_size": 1024, "intermediate_size": 2816,
         "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 8,
         "head_dim": 64, "max_position_embeddings": 128, "rms_norm_eps": 1e-6,
         "rope_theta": 10000.0, "tie_word_embeddings": True}
TRAINING = {"seq": 128, "global_batch": 4, "steps": 2, "seed": 1234, "max_norm": 1.0,
            "lr": 1e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}
DEFAULT_RUNS = "single:1,fsdp2:2,fsdp2:4,fsdp2_meta:4,fsdp1:4,ddp:4"
GIB = 2**30
POLL = 0.2


# ------------------------------------------------------------------ the ranks


def max_rss_bytes() -> int:
    """This process's peak resident memory so far (ru_maxrss is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def plain_name(name: str) -> str:
    """A parameter's name without the wrappers' prefixes (FSDP1, DDP)."""
    return name.replace("_fsdp_wrapped_module.", "").removeprefix("module.")


def wrap(model: Any, layout: str, world: int) -> Any:
    """`model` in `layout`'s wrapper (built in full on every rank)."""
    import torch

    if layout == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh, reshard_after_forward=True)
        return fully_shard(model, mesh=mesh, reshard_after_forward=True)
    if layout == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer

        return FullyShardedDataParallel(
            model, sharding_strategy=ShardingStrategy.FULL_SHARD, use_orig_params=True,
            auto_wrap_policy=ModuleWrapPolicy({Qwen3DecoderLayer}),
            device_id=torch.device("cpu"))  # None: "FSDP needs a non-CPU accelerator"
    if layout == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    return model


def materialize(model: Any, config: Any) -> None:
    """Allocate a model built on the meta device and sharded (each rank its shards only), and
    initialise it as Hugging Face does (`_init_weights`), rotary frequencies recomputed."""
    import torch

    model.to_empty(device="cpu")
    torch.manual_seed(TRAINING["seed"])
    with torch.no_grad():
        model.apply(model._init_weights)
        rotary = model.model.rotary_emb
        rotary.inv_freq.copy_(rotary.rope_init_fn(config, torch.device("cpu"))[0])
        rotary.original_inv_freq = rotary.inv_freq


def optimizer_for(model: Any, decay_names: set[str]) -> Any:
    """AdamW with weight decay on the matrices that are not norms."""
    import torch

    named = list(model.named_parameters())
    decay = [p for n, p in named if plain_name(n) in decay_names]
    other = [p for n, p in named if plain_name(n) not in decay_names]
    return torch.optim.AdamW([{"params": decay, "weight_decay": TRAINING["weight_decay"]},
                              {"params": other, "weight_decay": 0.0}],
                             lr=TRAINING["lr"], betas=tuple(TRAINING["betas"]),
                             eps=TRAINING["eps"])


def clip(model: Any, layout: str) -> float:
    """Clip the gradients to `max_norm`; the total norm before clipping."""
    import torch

    max_norm = TRAINING["max_norm"]
    if layout == "fsdp1":
        return float(model.clip_grad_norm_(max_norm))
    if layout.startswith("fsdp2"):  # torchtitan's clip_grad_norm_: the DTensor norm made whole
        from torch.distributed.tensor import DTensor

        params = [p for p in model.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm([p.grad for p in params], 2.0)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
        return float(norm)
    return float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))


def batches(rank: int, world: int) -> list[tuple[Any, Any]]:
    """Each step's (tokens, labels) of this rank: its slice of the seeded global batch."""
    import torch

    gen = torch.Generator().manual_seed(TRAINING["seed"])
    shape, local = (TRAINING["global_batch"], TRAINING["seq"]), TRAINING["global_batch"] // world
    steps = []
    for _ in range(TRAINING["steps"]):
        tokens = torch.randint(0, MODEL["vocab_size"], shape, generator=gen)
        labels = torch.randint(0, MODEL["vocab_size"], shape, generator=gen)
        part = slice(rank * local, (rank + 1) * local)
        steps.append((tokens[part], labels[part]))
    return steps


def rank_main(rank: int, spec: dict[str, Any]) -> None:
    """One rank (or the one process): build, train, write rank{rank}.json to spec["out"]."""
    import datetime

    import torch
    import torch.distributed as dist
    from transformers import Qwen3Config, Qwen3ForCausalLM

    layout, world = spec["layout"], spec["world"]
    torch.set_num_threads(spec["threads"])
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=spec["timeout"]))
    torch.manual_seed(TRAINING["seed"])
    config = Qwen3Config(**MODEL, use_cache=False, attn_implementation="sdpa",
                         torch_dtype=torch.float32)
    meta = layout == "fsdp2_meta"
    with torch.device("meta" if meta else "cpu"):
        model = Qwen3ForCausalLM(config).train()
    parameters = sum(p.numel() for p in model.parameters())
    decay_names = {n for n, p in model.named_parameters() if p.ndim >= 2 and "norm" not in n}
    model = wrap(model, "fsdp2" if meta else layout, world)
    if meta:
        materialize(model, config)
    optimizer = optimizer_for(model, decay_names)
    built_time, built_max_rss = time.time(), max_rss_bytes()
    losses, norms, times = [], [], []
    for tokens, labels in batches(rank, world):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        logits = model(input_ids=tokens).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, MODEL["vocab_size"]),
                                                 labels.reshape(-1))
        loss.backward()
        norms.append(clip(model, layout))
        optimizer.step()
        mean = loss.detach().clone()
        if world > 1:
            dist.all_reduce(mean)  # gloo has no AVG
            mean /= world
        losses.append(float(mean))
        times.append(time.perf_counter() - start)
        del logits, loss
    report = {"rank": rank, "pid": os.getpid(), "parameters": parameters,
              "built_time": built_time, "built_max_rss": built_max_rss,
              "max_rss": max_rss_bytes(), "losses": losses, "grad_norms": norms,
              "step_times": times, "attention": config._attn_implementation}
    Path(spec["out"], f"rank{rank}.json").write_text(json.dumps(report))
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def floor_main(spec: dict[str, Any]) -> None:
    """The import floor: torch and transformers' Qwen3 imported, nothing built."""
    import torch  # noqa: F401
    from transformers import Qwen3ForCausalLM  # noqa: F401

    time.sleep(3 * POLL)  # let the poller see the settled process
    report = {"rank": 0, "pid": os.getpid(), "built_time": time.time(),
              "built_max_rss": max_rss_bytes(), "max_rss": max_rss_bytes(), "losses": [],
              "grad_norms": [], "step_times": []}
    Path(spec["out"], "rank0.json").write_text(json.dumps(report))


def worker(spec: dict[str, Any]) -> None:
    """The launcher: the one process itself, or `spec["world"]` spawned ranks."""
    if spec["layout"] == "floor":
        floor_main(spec)
    elif spec["world"] == 1:
        rank_main(0, spec)
    else:
        import torch.multiprocessing

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(spec["port"]))
        torch.multiprocessing.spawn(rank_main, args=(spec,), nprocs=spec["world"], join=True)


# ------------------------------------------------------------------ the parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_polled(spec: dict[str, Any], timeout: float, log: Path,
               ) -> tuple[int, int, dict[int, list[tuple[float, int]]]]:
    """Run the launcher on `spec`; its exit code, its PID and, per PID of it and of its
    descendants, the (time, resident bytes) samples taken every POLL seconds. Past `timeout`,
    or on an error, every process it started is killed by PID."""
    import psutil

    command = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)]
    samples: dict[int, list[tuple[float, int]]] = {}
    seen: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            root = psutil.Process(process.pid)
            seen[root.pid] = root
            while process.poll() is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"killed after {timeout:.0f} s")
                with contextlib.suppress(psutil.Error):
                    seen.update((p.pid, p) for p in root.children(recursive=True))
                now = time.time()
                for pid, proc in list(seen.items()):
                    with contextlib.suppress(psutil.Error):
                        samples.setdefault(pid, []).append((now, proc.memory_info().rss))
                time.sleep(POLL)
        except BaseException:
            kill_started(process, seen)
            raise
    if process.returncode != 0:
        kill_started(process, seen)  # ranks a failed launcher left behind
    return process.returncode, process.pid, samples


def kill_started(process: subprocess.Popen, seen: dict[int, Any]) -> None:
    """SIGKILL the launcher and every descendant seen, each by PID (psutil checks that the
    PID still names the same process)."""
    import psutil

    for pid, proc in seen.items():
        if pid == process.pid:
            continue
        with contextlib.suppress(psutil.Error):
            proc.kill()
    if process.poll() is None:
        os.kill(process.pid, signal.SIGKILL)
    process.wait()


def measure(layout: str, world: int, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """One run: the largest rank's built and training peaks, polled and ru_maxrss (bytes)."""
    out = tmp / f"{layout}-{world}"
    out.mkdir()
    spec = {"layout": layout, "world": world, "threads": args.threads, "out": str(out),
            "port": free_port(), "timeout": args.timeout}
    began = time.perf_counter()
    try:
        code, launcher, samples = run_polled(spec, args.timeout, tmp / f"{layout}-{world}.log")
    except TimeoutError as exc:
        return {"layout": layout, "world": world, "status": str(exc)}
    reports = [json.loads(path.read_text()) for path in sorted(out.glob("rank*.json"))]
    if code != 0:
        tail = (tmp / f"{layout}-{world}.log").read_text()[-3000:]
        print(f"{layout} on {world}: exit {code}, {len(reports)} reports\n{tail}",
              file=sys.stderr, flush=True)
    if len(reports) != world:  # a launcher failing after every rank reported keeps its figures
        return {"layout": layout, "world": world, "status": f"failed (exit {code})"}
    rows = []
    for report in reports:
        mine = samples.get(report["pid"], [])
        rows.append({"built_polled": max((rss for t, rss in mine if t <= report["built_time"]),
                                         default=0),
                     "training_polled": max((rss for _, rss in mine), default=0),
                     "built_max_rss": report["built_max_rss"], "max_rss": report["max_rss"]})
    result = {key: max(row[key] for row in rows) for key in rows[0]}
    result.update(layout=layout, world=world, status="ok", exit=code, losses=reports[0]["losses"],
                  grad_norms=reports[0]["grad_norms"], step_times=reports[0]["step_times"],
                  parameters=reports[0].get("parameters"), wall=time.perf_counter() - began,
                  launcher_polled=max((rss for _, rss in samples.get(launcher, [])), default=0))
    print(json.dumps(result), file=sys.stderr, flush=True)
    return result


def print_table(results: list[dict[str, Any]]) -> None:
    single = next((r for r in results if r["layout"] == "single" and r["status"] == "ok"), None)
    print("| layout | ranks | built, polled | built, ru_maxrss | training, polled | "
          "training, ru_maxrss | ratio to one process (polled / ru_maxrss) | "
          "loss per step | grad norm per step | exit |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        name = "import floor (torch + transformers)" if r["layout"] == "floor" else r["layout"]
        ranks = "-" if r["layout"] == "floor" else r["world"]
        if r["status"] != "ok":
            print(f"| {name} | {ranks} | {r['status']} | | | | | | | |")
            continue
        cells = [f"{r[key] / GIB:.2f}" for key in
                 ("built_polled", "built_max_rss", "training_polled", "max_rss")]
        ratio = "-"
        if single is not None and r["layout"] != "floor":
            ratio = (f"{r['training_polled'] / single['training_polled']:.2f} / "
                     f"{r['max_rss'] / single['max_rss']:.2f}")
        losses = ", ".join(f"{x:.4f}" for x in r["losses"]) or "-"
        norms = ", ".join(f"{x:.4f}" for x in r["grad_norms"]) or "-"
        print(f"| {name} | {ranks} | {' | '.join(cells)} | {ratio} | {losses} | {norms} | "
              f"{r['exit']} |")


def versions() -> str:
    import importlib.metadata

    return ", ".join(f"{name} {importlib.metadata.version(name)}"
                     for name in ("torch", "transformers", "psutil"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default=DEFAULT_RUNS,
                        help=f"layout:ranks, comma-separated (default {DEFAULT_RUNS}; layouts "
                             "single, fsdp2, fsdp2_meta, fsdp1, ddp)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch.set_num_threads in each rank and the one process")
    parser.add_argument("--timeout", type=float, default=600,
                        help="seconds before a run is killed (default 600)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    runs = [("floor", 1)] + [(layout, int(ranks)) for layout, ranks in
                             (item.split(":") for item in args.runs.split(","))]
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; {versions()}; "
          f"{args.threads} thread(s) per process", flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="torch-fsdp-memory-") as name:
        for layout, world in runs:
            results.append(measure(layout, world, args, Path(name)))
    parameters = next((r["parameters"] for r in results if r.get("parameters")), 0)
    print(f"\n{parameters / 1e6:.1f}M parameters; GiB, the largest rank's peak resident memory")
    print_table(results)
    spawned = [r["launcher_polled"] for r in results if r["status"] == "ok" and r["world"] > 1]
    if spawned:
        print(f"\nThe spawning launchers' polled peak: at most {max(spawned) / GIB:.2f} GiB "
              "(a spawned rank's ru_maxrss starts from its launcher's).")


if __name__ == "__main__":
    main()
