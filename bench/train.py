"""Candidate training throughput: the trainer child's own task function against a bare hand-written PyTorch loop.

    python -m bench.train                      # cuda when available, else cpu; all three cases
    python -m bench.train --device cpu --cases 2d --samples 192 --batch 32 --epochs 2 --rounds 2

Three cases, synthetic classification data (10 classes):
- 1d: 4x1024 signals, a conv + residual net (0.19 M parameters), batch 128;
- 2d: 3x32x32 images, a residual CNN (0.91 M parameters), batch 256;
- 3d: 1x32x32x32 volumes, a conv + residual net (0.22 M parameters), batch 32.

Each timed run trains one candidate from scratch for `--epochs` epochs with a validation pass after each, and
three runners train the same network (same builder `evolve.build.build_model`, same initial weights and input
normalisation, same optimizer, same batches in the same order, bf16 autocast on GPUs):
- trainer: `evolve.train.train_task`, what a worker's trainer child runs for every task, with its real
  `launch.trainer.TaskContext` (per-epoch progress over a real pipe; the data already on the device, as after a
  child's first task), and its own `[train]` defaults (on GPUs channels-last and CUDA graphs, gradient clipping,
  OneCycle, the best epoch's weights kept, the latency probe);
- bare: the plain loop (forward, loss, backward, step; the loss looked at once per epoch);
- recipe: the bare loop plus the trainer's gradient clipping, OneCycle schedule and best-weights copy, the peer
  with the same recipe: the trainer should be at least as fast as it.
The runners alternate (the order rotates every round), so machine noise hits all of them; the median of the
rounds is kept (on a CPU also the process's CPU seconds, which a shared machine's load does not stretch;
run with `--threads 1` there). `--compile` adds the trainer with `train.compile = true` and reports its compile seconds;
`--eager` adds the trainer with `train.cuda_graphs = false` (what the graphs gain on CUDA GPUs).
"""
from __future__ import annotations

import argparse
import copy
import multiprocessing
import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from galapagos.evolve.build import build_model, set_normalization
from galapagos.evolve.check import count_params
from galapagos.evolve.genome import Genome
from galapagos.evolve.problem import Problem
from galapagos.evolve.train import TrainConfig, TrainTask, device_data, normalization_stats, train_task
from galapagos.launch.trainer import TaskContext


def _conv(ch, k=3, s=1):
    return {"type": "conv", "channels": ch, "kernel": k, "stride": s, "act": "relu"}


def _res(ch):
    return {"type": "residual", "channels": ch, "kernel": 3, "act": "relu"}


POOL, CLASSES = {"type": "pool", "op": "max", "size": 2}, 10


@dataclass(frozen=True)
class Case:
    shape: tuple[int, ...]
    layers: list
    batch: int
    units: int = 128


CASES = {
    "1d": Case((4, 1024), [_conv(32, 5, 2), _res(64), POOL, _res(96), POOL, _res(128)], 128),
    "2d": Case((3, 32, 32), [_conv(64), _res(64), POOL, _res(128), POOL, _res(128), _res(128)], 256),
    "3d": Case((1, 32, 32, 32), [_conv(16, 3, 2), _res(32), POOL, _res(64)], 32, units=64),
}


def _genome(case: Case, batch: int) -> Genome:
    layers = [*case.layers, {"type": "dense", "units": case.units, "act": "relu"}]
    return Genome.from_json({"layers": layers, "optimizer": "adamw", "lr": 2e-3, "batch_size": batch,
                             "weight_decay": 1e-4, "head": "avg"})


def _data(case: Case, train: int, val: int, seed: int) -> dict[str, np.ndarray]:
    """Noise plus a class-dependent offset per channel: learnable, so the best epoch moves."""
    rng = np.random.default_rng(seed)
    out = {}
    for split, n in (("train", train), ("val", val)):
        y = rng.integers(0, CLASSES, n)
        x = rng.standard_normal((n, *case.shape), dtype=np.float32)
        x[np.arange(n), y % case.shape[0]] += (0.2 + 0.05 * y).reshape(-1, *[1] * (len(case.shape) - 1))
        out[f"{split}/x"], out[f"{split}/y"] = x, y.astype(np.int64)
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bare_loop(genome: Genome, problem: Problem, data: dict, stats: dict, config: TrainConfig, device: torch.device,
              seed: int, recipe: bool) -> float:
    """A hand-written loop on the same network, weights, optimizer and batches; `recipe` adds the trainer's
    clipping, OneCycle and best-weights copy. Returns the best validation accuracy."""
    torch.manual_seed(seed)
    model = build_model(genome, problem)
    set_normalization(model, **stats)
    model.to(device)
    xtr, ytr = data["train"]
    xva, yva = data["val"]
    fused = {"fused": True} if device.type == "cuda" else {}
    opt = torch.optim.AdamW(model.parameters(), lr=genome.lr, weight_decay=genome.weight_decay, **fused)
    bs, n = genome.batch_size, min(xtr.shape[0], config.max_train_samples or xtr.shape[0])
    steps = max(1, n // bs) * config.epochs
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=genome.lr, total_steps=steps, pct_start=0.15)
    gpu = device.type == "cuda" and config.mixed_precision
    gen = torch.Generator(device="cpu").manual_seed(seed)
    best, best_state = -1.0, None
    for _ in range(config.epochs):
        model.train()
        order = torch.randperm(xtr.shape[0], generator=gen)[:n].to(device)
        total = torch.zeros((), device=device)
        for i in range(0, n, bs):
            idx = order[i:i + bs]
            if idx.numel() < 2:
                break
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=gpu):
                loss = F.cross_entropy(model(xtr[idx]).float(), ytr[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if recipe:
                torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            opt.step()
            if recipe and sched.last_epoch + 1 < steps:
                sched.step()
            total += loss.detach()
        model.eval()
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=gpu):
            out = torch.cat([model(xva[i:i + config.eval_batch_size]).float()
                             for i in range(0, xva.shape[0], config.eval_batch_size)])
        acc = (out.argmax(1) == yva).float().mean().item()
        if not np.isfinite(total.item()):
            raise FloatingPointError("the bare loop diverged")
        if recipe and acc > best:
            best_state = copy.deepcopy(model.state_dict())
        best = max(best, acc)
    del best_state
    return best


def _run(name: str, genome: Genome, problem: Problem, ctx: TaskContext, recv, config: TrainConfig, seed: int
         ) -> tuple[float, float, dict]:
    """One candidate trained by runner `name`: (wall seconds, this process's CPU seconds, its metrics)."""
    device = torch.device(ctx.device)
    data = device_data(ctx)
    _sync(device)
    t0, c0 = time.perf_counter(), time.process_time()
    if name.startswith("trainer"):
        cfg = TrainConfig(**{**config.to_dict(), "compile": name == "trainer+compile",
                             "cuda_graphs": name != "trainer+eager"})
        out = train_task(TrainTask(genome, problem, cfg, seed=seed), ctx)
        fitness, extra = out["fitness"], out["metrics"]
    else:
        stats = ctx.cache[("stats", problem.task)]
        fitness, extra = bare_loop(genome, problem, data, stats, config, device, seed, name == "recipe"), {}
    _sync(device)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    while recv.poll():  # the trainer's per-epoch progress, as its supervisor would read it
        recv.recv()
    return seconds, cpu, {"fitness": fitness, **extra}


def bench_case(key: str, args, device: torch.device) -> dict:
    case = CASES[key]
    problem = Problem(case.shape, "classification", CLASSES)
    genome = _genome(case, args.batch or case.batch)
    config = TrainConfig(epochs=args.epochs, mixed_precision=True, memory_format=args.memory_format)
    recv, send = multiprocessing.Pipe()  # duplex, as the supervisor's: the child polls it for a Cancel
    ctx = TaskContext(send, _data(case, args.samples, args.val, args.seed), str(device), torch.get_num_threads())
    ctx.cache[("stats", problem.task)] = normalization_stats(*device_data(ctx)["train"], problem.task)
    runners = (["trainer", "bare", "recipe"] + (["trainer+compile"] if args.compile else [])
               + (["trainer+eager"] if args.eager else []))
    times: dict[str, list[float]] = {r: [] for r in runners}
    cpu: dict[str, list[float]] = {r: [] for r in runners}
    last: dict[str, dict] = {}
    warm = TrainConfig(**{**config.to_dict(), "epochs": 1, "max_train_samples": 4 * genome.batch_size})
    cold = {}  # the warm-up's metrics: its compile was the first in this process (the timed ones hit its caches)
    for r in runners:  # warm-up, four batches: kernels, allocator, autotuning, compile caches
        cold[r] = _run(r, genome, problem, ctx, recv, warm, args.seed)[2]
    for k in range(args.rounds):
        for r in runners[k % len(runners):] + runners[:k % len(runners)]:
            seconds, cpu_seconds, last[r] = _run(r, genome, problem, ctx, recv, config, args.seed)
            times[r].append(seconds)
            cpu[r].append(cpu_seconds)
    rate = {r: args.samples * args.epochs / statistics.median(t) for r, t in times.items()}
    cpu_rate = {r: args.samples * args.epochs / statistics.median(t) for r, t in cpu.items()}
    return {"case": key, "shape": "x".join(map(str, case.shape)), "params": count_params(genome, problem),
            "batch": genome.batch_size, "rate": rate, "cpu_rate": cpu_rate, "times": times, "cpu": cpu,
            "last": last, "cold": cold}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--cases", nargs="+", choices=tuple(CASES), default=list(CASES))
    p.add_argument("--samples", type=int, default=20480, help="training samples (one epoch)")
    p.add_argument("--val", type=int, default=0, help="validation samples; 0 = a quarter of --samples")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3, help="timed runs of each runner, alternating")
    p.add_argument("--batch", type=int, default=0, help="batch size; 0 = each case's own")
    p.add_argument("--threads", type=int, default=0, help="torch threads on the CPU; 0 = torch's default")
    p.add_argument("--compile", action="store_true", help="also time the trainer with train.compile = true")
    p.add_argument("--eager", action="store_true", help="also time the trainer with train.cuda_graphs = false")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--memory-format", default="auto", choices=("auto", "channels_last", "contiguous"),
                   help="the trainer's train.memory_format (the bare loops stay contiguous)")
    args = p.parse_args(argv)
    args.val = args.val or max(2, args.samples // 4)
    device = torch.device("cuda:0" if args.device == "cuda" else args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            p.error("--device cuda: this torch sees no CUDA device")
        torch.cuda.set_device(device)
        what = f"{torch.cuda.get_device_name(device)}, bf16 autocast"
    else:
        what = f"CPU, {torch.get_num_threads()} torch threads, float32"
    print(f"torch {torch.__version__} on {what}; {args.samples} training samples x {args.epochs} epochs, "
          f"{args.val} validation samples, median of {args.rounds} alternating rounds", flush=True)
    rows = []
    for key in args.cases:
        t0 = time.perf_counter()
        res = bench_case(key, args, device)
        rows.append(res)
        print(f"{key}: {time.perf_counter() - t0:.0f} s; seconds per run (wall / CPU): "
              + "; ".join(f"{r} {[round(t, 2) for t in ts]} / {[round(t, 2) for t in res['cpu'][r]]}"
                          for r, ts in res["times"].items())
              + f"; trainer metrics: {res['last']['trainer']}", flush=True)
    # On a CPU the process's CPU seconds are given too: a shared machine's load stretches wall times, not these.
    on_cpu = device.type == "cpu"
    extra = (" | trainer/bare, CPU s | trainer/recipe, CPU s" if on_cpu else "") + (
        " | trainer+compile samples/s | compile s, first / later" if args.compile else "") + (
        " | trainer+eager samples/s | trainer/eager" if args.eager else "")
    print(f"\n| case | params | batch | trainer samples/s | bare samples/s | recipe samples/s | trainer/bare "
          f"| trainer/recipe{extra} |")
    print("|---|---|---|---|---|---|---|---|" + "---|---|" * (on_cpu + args.compile + args.eager))
    for res in rows:
        rate = res["rate"]
        cells = [f"{res['case']} {res['shape']}", f"{res['params'] / 1e6:.2f} M", res["batch"],
                 f"{rate['trainer']:.0f}", f"{rate['bare']:.0f}", f"{rate['recipe']:.0f}",
                 f"{rate['trainer'] / rate['bare']:.2f}", f"{rate['trainer'] / rate['recipe']:.2f}"]
        if on_cpu:
            cr = res["cpu_rate"]
            cells += [f"{cr['trainer'] / cr['bare']:.2f}", f"{cr['trainer'] / cr['recipe']:.2f}"]
        if args.compile:
            cells += [f"{rate['trainer+compile']:.0f}", f"{res['cold']['trainer+compile'].get('compile_seconds')} / "
                      f"{res['last']['trainer+compile'].get('compile_seconds')}"]
        if args.eager:
            cells += [f"{rate['trainer+eager']:.0f}", f"{rate['trainer'] / rate['trainer+eager']:.2f}"]
        print("| " + " | ".join(map(str, cells)) + " |")


if __name__ == "__main__":
    main()
