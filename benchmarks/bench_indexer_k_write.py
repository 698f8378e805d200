"""GPU benchmark of the ``indexer_k_write`` rewrite (LayerNorm + fp8 quant + paged-cache write).

The workload, per case of T new tokens (head_dim 128, block_size 64, ue8m0 scales, float32
LayerNorm weight and bias, slots a random permutation over the cache, fixed seeds)::

    write_indexer_k(layer_norm_k(k, weight, bias), kv_cache, slot_mapping, ue8m0=True)

Columns (times in us):

* eager: the function as written, captured in a CUDA graph;
* stock: ``torch.compile(backend="inductor", fullgraph=True)``; ``-`` with a note when it
  fails to compile (torch 2.11 on GPU: "must be 1 to view Float as Byte");
* kda: the same with ``backend="kda_inductor"`` (one ``kda.indexer_k_write`` launch);
* floor: bytes that must move (k read, values and scales written, slots, weight and bias
  read) over the measured device-to-device copy bandwidth.

Every compiled result is checked against eager on a poisoned cache before timing (bytes
outside the written slots identical, values within one fp8 step: the fused LayerNorm sums
in another order); a mismatch raises ``MismatchError``. Compiled functions are timed by
CUDA-graph replay (``_timing``), ``--calls-per-graph`` calls per graph.

``--smoke`` runs tiny cases on CPU (no CUDA): same checks, timings by
``time.perf_counter`` that are NOT meaningful, nothing recorded.

Usage: ``python benchmarks/bench_indexer_k_write.py [--cases 1,64,2048,16384] [--reps N]
[--no-record] [--smoke]``.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path
from typing import Callable

import torch

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))
if str(_HERE.parent) not in sys.path:
    sys.path.append(str(_HERE.parent))

from _timing import (  # noqa: E402
    add_ratios,
    environment_info,
    graph_replay_median_us,
    markdown_table,
    measure_copy_bandwidth,
    perf_counter_median_us,
    print_table,
    record_results,
    write_out_json,
)
from kda_inductor.reference import (  # noqa: E402
    cache_row_bytes,
    layer_norm_k,
    write_indexer_k,
    written_cache_mismatch,
)

NAME = "indexer_k_write"
RESULTS_DIR = _HERE / "results"
BLOCK_SIZE = 64
HEAD_DIM = 128
UE8M0 = True
CASES = (1, 64, 2048, 16384)
SMOKE_CASES = (1, 64)
BACKENDS = {"stock": "inductor", "kda": "kda_inductor"}
COLUMNS = (
    ("T", "T", ","),
    ("eager_us", "eager us", ".1f"),
    ("stock_us", "stock us", ".1f"),
    ("kda_us", "kda us", ".2f"),
    ("floor_us", "floor us", ".2f"),
    ("kda_over_floor", "kda/floor", ".2f"),
    ("eager_over_kda", "eager/kda", ".1f"),
    ("stock_over_kda", "stock/kda", ".1f"),
)


class MismatchError(AssertionError):
    """A compiled write left the cache different from eager's beyond the allowed tolerance."""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def write_step(k, weight, bias, kv_cache, slot_mapping, norm: bool = True):
    """The benchmarked code: DeepSeek-V3.2's k_norm, then quant + write (masked padding);
    ``norm=False``: quant + write only (V3.2's spelling, where the rotary sits between)."""
    write_indexer_k(layer_norm_k(k, weight, bias) if norm else k, kv_cache, slot_mapping, ue8m0=UE8M0)


def make_inputs(num_tokens: int, device, seed: int = 0) -> tuple:
    """``(k, weight, bias, kv_cache, slot_mapping)``: a poisoned cache with room for T tokens
    plus one spare block (block 0, the null block), slots a random permutation."""
    g = torch.Generator().manual_seed(seed)
    num_blocks = -(-num_tokens // BLOCK_SIZE) + 1
    k = (torch.randn(num_tokens, HEAD_DIM, generator=g) * 2).to(torch.bfloat16)
    weight = torch.rand(HEAD_DIM, generator=g) + 0.5
    bias = torch.randn(HEAD_DIM, generator=g) * 0.1
    cache = torch.randint(0, 256, (num_blocks, BLOCK_SIZE, cache_row_bytes(HEAD_DIM)),
                          dtype=torch.uint8, generator=g)
    slots = torch.randperm((num_blocks - 1) * BLOCK_SIZE, generator=g)[:num_tokens] + BLOCK_SIZE
    return tuple(x.to(device) for x in (k, weight, bias, cache, slots))


def compile_write(backend: str, tag: str, norm: bool = True) -> Callable:
    def step(k, weight, bias, kv_cache, slot_mapping):
        write_step(k, weight, bias, kv_cache, slot_mapping, norm)

    step.__code__ = step.__code__.replace(co_name=f"write_{tag}")
    return torch.compile(step, backend=backend, fullgraph=True, dynamic=False)


def bytes_moved(num_tokens: int) -> int:
    return (num_tokens * HEAD_DIM * 2 + num_tokens * cache_row_bytes(HEAD_DIM)
            + num_tokens * 8 + 2 * HEAD_DIM * 4)


def check(label: str, fn: Callable, inputs: tuple, expected: torch.Tensor) -> None:
    k, w, b, cache, slots = inputs
    poisoned = cache.clone()
    fn(k, w, b, poisoned, slots)
    why = written_cache_mismatch(poisoned, expected, slots, HEAD_DIM)
    if why:
        raise MismatchError(f"{label}: {why}")


def run_case(num_tokens: int, device, timer: Callable[[Callable], float], bandwidth, norm: bool = True) -> dict:
    """One row; ``norm=False`` times quant + write only (the hybrid model's spelling)."""
    inputs = make_inputs(num_tokens, device)
    k, w, b, cache, slots = inputs
    expected = cache.clone()
    write_step(k, w, b, expected, slots, norm)
    row: dict = {"T": num_tokens, "bytes": bytes_moved(num_tokens), "notes": ""}
    fns = {"eager": functools.partial(write_step, norm=norm)}
    for column, backend in BACKENDS.items():
        log(f"[T={num_tokens}] compiling {column} (backend={backend!r})")
        fn = compile_write(backend, f"{column}_{num_tokens}{'' if norm else '_nonorm'}", norm)
        t0 = time.perf_counter()
        try:
            check(f"[T={num_tokens}] {column}", fn, inputs, expected)
        except MismatchError:
            raise
        except Exception as exc:  # noqa: BLE001 - stock Inductor may fail to compile it
            if column == "kda":
                raise
            msg = str(exc).strip().splitlines()[0][:120] if str(exc).strip() else type(exc).__name__
            log(f"[T={num_tokens}] {column} fails: {type(exc).__name__}: {msg}")
            row["notes"] += f"{column} fails: {type(exc).__name__}: {msg}. "
            continue
        log(f"[T={num_tokens}] {column}: matches eager ({time.perf_counter() - t0:.1f} s)")
        fns[column] = fn
    for column, fn in fns.items():
        row[f"{column}_us"] = timer(lambda fn=fn: fn(*inputs))
    row["floor_us"] = row["bytes"] / bandwidth * 1e6 if bandwidth else None
    return add_ratios(row, (("kda_over_floor", "kda_us", "floor_us"), ("eager_over_kda", "eager_us", "kda_us"),
                            ("stock_over_kda", "stock_us", "kda_us")))


MODEL_SHAPE = "ue8m0 after rotary, D=128"
"""The write as the hybrid model spells it: quant + write (its rotary keeps the norm out)."""


def report_row(T: int, s, norm: bool = True) -> dict:
    """The write at ``T`` tokens for ``benchmarks/report.py``; stock marked where it fails."""
    row = run_case(T, s.device, s.timer, s.bandwidth, norm=norm)
    row.update(rewrite="indexer_k_write", shape="LN+ue8m0, D=128" if norm else MODEL_SHAPE)
    if row.get("stock_us") is None:  # stock Inductor cannot compile it: it runs eager there
        row["stock_fails"] = True
    return s.ratios(row)


def report_jobs(s) -> list:
    """LayerNorm + quant + write at each size; quant + write at the model's steps."""
    return ([lambda T=T: report_row(T, s) for T in s.sizes]
            + [lambda T=T: report_row(T, s, norm=False) for T in s.steps.values()])


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", help=f"comma-separated token counts (default {','.join(map(str, CASES))}; "
                   f"smoke {','.join(map(str, SMOKE_CASES))})")
    p.add_argument("--reps", type=int, help="timed samples (default 100; smoke 3)")
    p.add_argument("--inner", type=int, default=20, help="graph replays per sample (default 20)")
    p.add_argument("--calls-per-graph", type=int, default=10,
                   help="calls captured per CUDA graph (default 10): amortizes graph-launch cost")
    p.add_argument("--no-record", action="store_true", help="do not write benchmarks/results/")
    p.add_argument("--smoke", action="store_true", help="tiny cases on CPU, meaningless timings")
    args = p.parse_args(argv)
    args.cases = [int(c) for c in args.cases.split(",")] if args.cases else list(
        SMOKE_CASES if args.smoke else CASES)
    if args.reps is None:
        args.reps = 3 if args.smoke else 100
    return args


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    import torch._inductor.config as config

    config.force_disable_caches = True
    import kda_inductor  # noqa: F401 - registers the backend

    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("CUDA is not available; use --smoke for the CPU check")
    if args.smoke:
        device, bandwidth = "cpu", None
        timer = lambda fn: perf_counter_median_us(fn, args.reps)  # noqa: E731
        label = "SMOKE: CPU time.perf_counter, NOT meaningful"
    else:
        device = "cuda"
        log("measuring copy bandwidth")
        bandwidth = measure_copy_bandwidth(device)
        timer = lambda fn: graph_replay_median_us(  # noqa: E731
            fn, reps=args.reps, inner=args.inner, calls=args.calls_per_graph)
        label = (f"CUDA-graph replay median ({args.reps} x {args.inner} replays of graphs of "
                 f"{args.calls_per_graph} calls, per call)")
    rows = []
    for t in args.cases:
        rows.append(run_case(t, device, timer, bandwidth))
        print_table(rows[-1:], COLUMNS)
    notes = f"Times in us. {label}. LayerNorm + ue8m0 quant + write, head_dim {HEAD_DIM}, block {BLOCK_SIZE}."
    fails = " ".join(f"T={r['T']}: {r['notes']}" for r in rows if r["notes"])
    if fails:
        notes += " " + fails
    if not args.smoke:
        notes += f" Copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + write)."
        payload = {"benchmark": NAME, "env": environment_info(), "notes": notes,
                   "settings": {"block_size": BLOCK_SIZE, "head_dim": HEAD_DIM, "ue8m0": UE8M0,
                                "reps": args.reps, "inner": args.inner,
                                "calls_per_graph": args.calls_per_graph, "backends": BACKENDS},
                   "copy_bandwidth_bytes_per_s": bandwidth, "rows": rows}
        written = [write_out_json(f"bench_{NAME}.json", payload)]
        if not args.no_record:
            written += record_results(NAME, payload, markdown_table(rows, COLUMNS), results_dir=RESULTS_DIR,
                                      title=f"{NAME} benchmark", notes=notes)
        for path in filter(None, written):
            log(f"wrote {path}")
    print_table(rows, COLUMNS, title=f"{NAME}: {notes}")
    return rows


if __name__ == "__main__":
    main()
