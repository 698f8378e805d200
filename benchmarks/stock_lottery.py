"""Stock Inductor's lottery: transformers' recurrent decode step alone, compiled N times on fresh
caches, each compile's launch choice and the time it gives.

The whole-step table (``benchmarks/results/hf_models.md``) saw stock's reduction for the recurrent
loop at 226 us in one run and 751 us in another, same model, same GPU. This script isolates that
kernel: ``torch.compile`` (stock, default mode) of transformers' ``torch_recurrent_gated_delta_rule``
as Qwen3-Next's layer calls it for decode (prologue, GQA repeat, the cache's ``state.copy_``:
``bench_gdn_recurrent_step.transformers_step``), ``--compiles`` times, **each compile in a fresh
process on an empty Inductor cache** (its own ``TORCHINDUCTOR_CACHE_DIR``: no autotune result is
reused; Triton's binary cache is shared, which changes no choice). Per compile it records:

* for every Inductor Triton kernel that autotuned (several launch configs), what the autotuner
  saw: each config's benchmark time as ``CachingAutotuner.benchmark_all_configs`` measured it
  (the choice is the smallest), and the same configs timed again afterwards, five times each
  (``bench_again_us``: the autotuner's own ``bench`` on the same arguments), so the noise of one
  autotune measurement and the real ranking are both visible;
* the config each kernel launches with after autotuning;
* the step's time: CUDA-graph replay median (``_timing``), two rounds.

    python -m benchmarks.stock_lottery --compiles 6 --batch 32      # GPU, ~2-3 minutes
    python -m benchmarks.stock_lottery --smoke                       # CPU: the code paths only

Results: ``benchmarks/results/stock_lottery.{md,json}`` (and ``$OUT`` when set). What the runs
showed and what a user of stock torch.compile can do about it: docs/speed-rules.md ("Stock
Inductor's lottery").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
if str(_HERE.parent) not in sys.path:
    sys.path.insert(0, str(_HERE.parent))

NAME = "stock_lottery"
COLUMNS = (("compile", "compile", "d"), ("compile_s", "compile s", ".1f"), ("step_us", "step us", ".1f"),
           ("kernel", "autotuned kernel (costliest)", "s"), ("chosen", "chosen config", "s"),
           ("seen", "autotune saw, us per config", "s"), ("again", "timed again (median of 5), us", "s"))


def _config_text(cfg) -> str:
    kw = dict(getattr(cfg, "kwargs", {}) or {})
    parts = [f"{k}={v}" for k, v in sorted(kw.items())]
    parts += [f"w{getattr(cfg, 'num_warps', '?')}", f"s{getattr(cfg, 'num_stages', '?')}"]
    return " ".join(parts)


def _record_autotuning() -> list[dict]:
    """Wrap ``CachingAutotuner.benchmark_all_configs`` so that each call's timings are kept, and
    each config is benchmarked five more times on the same arguments (the autotuner's ``bench``)."""
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    seen: list[dict] = []
    original = CachingAutotuner.benchmark_all_configs

    def wrapped(self, *args, **kwargs):
        launchers = list(self.launchers)
        timings = original(self, *args, **kwargs)
        again = {}
        for launcher in launchers:
            try:
                again[_config_text(launcher.config)] = [float(self.bench(launcher, *args, **kwargs)) * 1e3
                                                       for _ in range(5)]
            except Exception as err:  # noqa: BLE001 - a closed losing launcher: what the autotuner saw stands
                again[_config_text(launcher.config)] = [f"{type(err).__name__}"]
        seen.append({"kernel": (self.inductor_meta or {}).get("kernel_name") or self.fn.__name__,
                     "seen_us": {_config_text(k.config): float(v) * 1e3 for k, v in timings.items()},
                     "again_us": again})
        return timings

    CachingAutotuner.benchmark_all_configs = wrapped
    return seen


def worker(spec: dict) -> dict:
    """One compile in this (fresh) process: the step compiled by stock Inductor, autotuning
    recorded, the launch configs and the step's time."""
    import torch

    from benchmarks import _timing, hf_models
    from benchmarks import bench_gdn_recurrent_step as g

    device = "cpu" if spec["smoke"] else "cuda"
    m = (g.SMOKE_MODELS if spec["smoke"] else g.MODELS)["qwen3_next"]
    seen = _record_autotuning() if device == "cuda" else []
    step, where = g.transformers_step("qwen3_next")
    x = g.make_inputs(m, spec["batch"], spec["tokens"], device, seed=spec["seed"])
    compiled = torch.compile(step)
    t0 = time.perf_counter()
    compiled(x)
    if device == "cuda":
        torch.cuda.synchronize()
    compile_s = time.perf_counter() - t0
    if device == "cuda":
        graph, _ = _timing.capture_graph(lambda: compiled(x), warmup=3)
        step_us = [_timing.replay_median_us([graph], reps=50, inner=10) for _ in range(2)]
    else:
        step_us = [_timing.perf_counter_median_us(lambda: compiled(x), reps=3)]
    kernels = hf_models.inductor_kernels() if device == "cuda" else {}
    return {"where": where, "compile_s": compile_s, "step_us": statistics.median(step_us), "step_rounds": step_us,
            "autotuned": seen, "kernels": {k: v.get("config") for k, v in kernels.items()}}


def run_compiles(args) -> list[dict]:
    """Each compile in its own process and cache folder, under one temporary root removed after."""
    root = Path(tempfile.mkdtemp(prefix="stock_lottery_"))
    try:
        return _compiles(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _compiles(args, root: Path) -> list[dict]:
    started = time.perf_counter()
    rows = []
    for i in range(args.compiles):
        cache = root / f"c{i}"
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
               "TRITON_CACHE_DIR": str(root / "triton"),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(_HERE.parent), os.environ.get("PYTHONPATH")]))}
        spec = {"smoke": args.smoke, "batch": args.batch, "tokens": 1, "seed": 0, "out": str(cache / "r.json")}
        cache.mkdir(parents=True)
        (cache / "spec.json").write_text(json.dumps(spec))
        t0 = time.perf_counter()
        if args.budget is not None and t0 - started > args.budget:
            rows.append({"compile": i + 1, "error": f"not started: past the {args.budget:.0f} s budget"})
            continue
        try:
            proc = subprocess.run([sys.executable, "-m", "benchmarks.stock_lottery", "--worker", str(cache / "spec.json")],
                                  env=env, cwd=_HERE.parent, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:  # the rows so far stand
            rows.append({"compile": i + 1, "error": f"killed after {args.timeout:.0f} s (--timeout)"})
            continue
        if proc.returncode != 0:
            print(proc.stdout[-2000:], proc.stderr[-3000:], flush=True)
            rows.append({"compile": i + 1, "error": (proc.stderr.strip().splitlines() or ["?"])[-1][:200]})
            continue
        record = json.loads((cache / "r.json").read_text())
        record["compile"], record["process_s"] = i + 1, time.perf_counter() - t0
        rows.append(row_of(record))
        print(json.dumps({k: rows[-1].get(k) for k in ("compile", "step_us", "kernel", "chosen", "seen")}), flush=True)
    return rows


def row_of(record: dict) -> dict:
    """The table row of one compile: its step time and the costliest autotuned kernel (the one
    whose configs differ most in the autotuner's eyes)."""
    row = dict(record)
    tuned = [t for t in record.get("autotuned") or [] if len(t["seen_us"]) > 1]
    if tuned:
        top = max(tuned, key=lambda t: max(t["seen_us"].values()))
        chosen = min(top["seen_us"], key=top["seen_us"].get)
        row["kernel"] = top["kernel"][:60]
        row["chosen"] = chosen
        row["seen"] = "; ".join(f"{c}: {v:.1f}" for c, v in top["seen_us"].items())
        row["again"] = "; ".join(f"{c}: {statistics.median(v):.1f}" if all(isinstance(x, float) for x in v)
                                 else f"{c}: -" for c, v in top["again_us"].items())
    else:
        row.update(kernel="-", chosen="-", seen="-", again="-")
    return row


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--compiles", type=int, default=6)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds per compile's process")
    parser.add_argument("--budget", type=float, default=None, help="seconds after which no compile starts")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny dims: the code paths only")
    parser.add_argument("--results-dir", default=None)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        spec = json.loads(Path(args.worker).read_text())
        Path(spec["out"]).write_text(json.dumps(worker(spec), default=str))
        return []
    from benchmarks import _timing

    started = time.perf_counter()
    rows = run_compiles(args)
    notes = (f"Stock torch.compile of transformers' Qwen3-Next recurrent decode step (B = {args.batch}, T = 1, "
             "one layer's state), each compile a fresh process on an empty Inductor cache. 'autotune saw': each "
             "launch config's time as the autotuner measured it once (the choice: the smallest); 'timed again': "
             "the same configs, the median of five more measurements on the same arguments.")
    _timing.finish(NAME, rows, COLUMNS, notes, smoke=args.smoke, record=True,
                   results_dir=args.results_dir or _HERE / "results", started=started)
    return rows


if __name__ == "__main__":
    main()
