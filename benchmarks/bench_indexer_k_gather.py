"""GPU benchmark of the ``indexer_k_gather`` rewrite (DeepSeek-V3.2 indexer K-cache gather).

Columns, per case (block_size 64, head_dim 128, fixed seeds):

* eager loop: ``gather_indexer_k_loop`` (per-request Python loop with host syncs),
  timed call by call with CUDA events (few reps: ~190 ms per call for ``seed``);
* stock: ``torch.compile(backend="inductor", fullgraph=True)`` of the vectorized
  ``gather_indexer_k``; kda: the same with ``backend="kda_inductor"``; both timed
  by CUDA-graph replay (see ``_timing``);
* floor: bytes that must move (values + scales read and written, plus block table
  and ``cu_seq_lens``) divided by the measured device-to-device copy bandwidth.

Before anything is timed, every compiled output is checked to be byte-identical
to the loop's for every selected case; a mismatch raises ``MismatchError``.
Compile caches are disabled so that the kda passes really run.

``--smoke`` runs tiny cases on CPU (no CUDA): same checks, timings by
``time.perf_counter`` that are NOT meaningful, nothing recorded.

Usage: ``python benchmarks/bench_indexer_k_gather.py [--cases seed,64req,4req]
[--skip-loop] [--reps N] [--no-record] [--smoke]``.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))  # for _timing when run as a script or imported by path
if str(_HERE.parent) not in sys.path:
    sys.path.append(str(_HERE.parent))  # the source tree, if the package is not installed

from _timing import (  # noqa: E402
    add_ratios,
    eager_median_us,
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
    gather_indexer_k,
    gather_indexer_k_loop,
    random_indexer_cache,
    scale_bytes,
)

NAME = "indexer_k_gather"
RESULTS_DIR = _HERE / "results"
BLOCK_SIZE = 64
HEAD_DIM = 128
LENGTHS_SEED = 1059
"""Seed of the request-length jitter; picked so that the cases' N land near the anchors'."""
BACKENDS = {"stock": "inductor", "kda": "kda_inductor"}
"""Table column -> torch.compile backend."""
RATIOS = (  # (key, numerator, denominator)
    ("stock_over_floor", "stock_us", "floor_us"),
    ("kda_over_floor", "kda_us", "floor_us"),
    ("stock_over_kda", "stock_us", "kda_us"),
    ("eager_over_kda", "eager_loop_us", "kda_us"),
)
COLUMNS = (
    ("case", "case", "s"),
    ("N", "N", ","),
    ("eager_loop_us", "eager loop us", ",.0f"),
    ("stock_us", "stock us", ".1f"),
    ("kda_us", "kda us", ".1f"),
    ("floor_us", "floor us", ".1f"),
    ("stock_over_floor", "stock/floor", ".2f"),
    ("kda_over_floor", "kda/floor", ".2f"),
    ("stock_over_kda", "stock/kda", ".2f"),
    ("eager_over_kda", "eager/kda", ",.1f"),
)


def request_lengths(num_requests: int) -> list[int]:
    """Lengths of ``num_requests`` requests: ~1000 tokens (+-8), every third ~1/3 as long.

    Cases are prefixes of one fixed list: N = 198,728 / 49,353 / 2,668 for
    256 / 64 / 4 requests (anchors: 198,724 / 49,348 / 2,668).
    """
    gen = torch.Generator().manual_seed(LENGTHS_SEED)
    jitter = torch.randint(-8, 9, (256,), generator=gen).tolist()
    lengths = [(1000 + d) if b % 3 else (1000 + d) // 3 for b, d in enumerate(jitter)]
    return lengths[:num_requests]


CASES = {"seed": request_lengths(256), "64req": request_lengths(64), "4req": request_lengths(4)}
"""GPU cases: name -> request lengths."""
SMOKE_CASES = {"tiny": [70, 0, 5], "4req": CASES["4req"]}
"""CPU smoke cases (``tiny`` covers an empty request and a partial second block)."""


class MismatchError(AssertionError):
    """A compiled gather's bytes differ from the eager loop's."""


@dataclass
class PreparedCase:
    """One case's inputs and its checked functions, ready to be timed."""

    name: str
    seq_lens: list[int]
    num_tokens: int
    input_sets: list[tuple]  # (kv_cache, block_table, cu_seq_lens), same shapes
    loop_fn: Callable
    compiled: dict[str, Callable] = field(default_factory=dict)  # column -> f(kv, bt, cu)
    compile_s: dict[str, float] = field(default_factory=dict)


@dataclass
class Timers:
    """How to time compiled functions (one callable per input set) and the eager loop."""

    compiled: Callable[[list[Callable]], float]
    eager: Callable[[Callable], float]
    label: str


def log(msg: str) -> None:
    """Progress line on stderr."""
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- setup


def configure_compile() -> None:
    """Disable compile caches so that every compile (and the kda passes) really runs."""
    import torch._inductor.config as config

    if hasattr(config, "force_disable_caches"):
        config.force_disable_caches = True


def import_backend() -> None:
    """Import ``kda_inductor``, which registers the ``kda_inductor`` backend."""
    import kda_inductor  # noqa: F401


def make_input_sets(seq_lens: list[int], n_sets: int, device) -> tuple[list[tuple], int]:
    """``n_sets`` random caches (seeds 0..n_sets-1) for ``seq_lens``; returns (sets, N)."""
    sets = []
    for seed in range(n_sets):
        gen = torch.Generator().manual_seed(seed)
        kv, table, cu, num_tokens = random_indexer_cache(
            seq_lens, BLOCK_SIZE, HEAD_DIM, device=device, generator=gen)
        sets.append((kv, table, cu))
    return sets, num_tokens


def make_loop_fn(inputs: tuple, num_tokens: int) -> Callable:
    """The eager loop over ``inputs`` into preallocated uint8 buffers; returns them."""
    kv, table, cu = inputs
    dst_value = torch.empty(num_tokens, HEAD_DIM, dtype=torch.uint8, device=kv.device)
    dst_scale = torch.empty(num_tokens, scale_bytes(HEAD_DIM), dtype=torch.uint8,
                            device=kv.device)
    return functools.partial(gather_indexer_k_loop, kv, dst_value, dst_scale, table, cu)


def compile_gather(backend: str, num_tokens: int, tag: str) -> Callable:
    """``torch.compile`` of ``f(kv_cache, block_table, cu_seq_lens)`` with static N.

    Each call makes a function with its own code object (named ``gather_<tag>``),
    so Dynamo keeps a separate cache and frame state per backend and case.
    """

    def gather(kv_cache, block_table, cu_seq_lens):
        return gather_indexer_k(kv_cache, block_table, cu_seq_lens, num_tokens)

    gather.__code__ = gather.__code__.replace(co_name=f"gather_{tag}")
    return torch.compile(gather, backend=backend, fullgraph=True, dynamic=False)


def as_bytes(values: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A gather's outputs, any dtype, as uint8 ``[N, head_dim]`` and ``[N, 4 * G]``."""
    n = values.shape[0]
    return (values.contiguous().view(torch.uint8),
            scales.contiguous().view(torch.uint8).reshape(n, -1))


def check_identical(label: str, got: tuple, ref: tuple) -> None:
    """Raise ``MismatchError`` unless ``got`` and ``ref`` hold the same bytes."""
    for part, g, r in zip(("values", "scales"), as_bytes(*got), as_bytes(*ref)):
        if g.shape != r.shape:
            raise MismatchError(
                f"{label}: {part} shape {tuple(g.shape)} != loop's {tuple(r.shape)}")
        if not torch.equal(g, r):
            bad_rows = (g != r).any(dim=1).nonzero().flatten()
            raise MismatchError(
                f"{label}: {part} differ from the loop reference in {bad_rows.numel()} of "
                f"{g.shape[0]} rows (first: {bad_rows[:8].tolist()})")


def prepare_case(name: str, seq_lens: list[int], device, n_sets: int) -> PreparedCase:
    """Build inputs, run the loop reference, compile each backend and check its bytes.

    The check runs on the first input set (the others, for ``--rotate``, share its shapes).
    """
    input_sets, num_tokens = make_input_sets(seq_lens, n_sets, device)
    case = PreparedCase(name, seq_lens, num_tokens, input_sets,
                        make_loop_fn(input_sets[0], num_tokens))
    reference = case.loop_fn()
    for column, backend in BACKENDS.items():
        log(f"[{name}] compiling {column} (backend={backend!r}, N={num_tokens:,})")
        fn = compile_gather(backend, num_tokens, f"{column}_{name}")
        t0 = time.perf_counter()
        out = fn(*input_sets[0])
        case.compile_s[column] = time.perf_counter() - t0
        check_identical(f"[{name}] {column}", out, reference)
        log(f"[{name}] {column}: byte-identical to the loop ({case.compile_s[column]:.1f} s)")
        case.compiled[column] = fn
    return case


# --------------------------------------------------------------------------- timing


def gpu_timers(reps: int, inner: int, loop_reps: int, calls: int) -> Timers:
    """CUDA-graph replay for compiled functions, CUDA events around eager loop calls."""
    return Timers(
        compiled=lambda fns: graph_replay_median_us(fns, reps=reps, inner=inner, calls=calls),
        eager=lambda fn: eager_median_us(fn, loop_reps),
        label=f"CUDA-graph replay median ({reps} x {inner} replays of graphs of {calls} "
              f"calls, per call); "
              f"eager loop: median of {loop_reps} calls (CUDA events)")


def cpu_timers(reps: int, loop_reps: int) -> Timers:
    """``time.perf_counter`` on CPU, first input set only: smoke runs, NOT meaningful."""
    return Timers(
        compiled=lambda fns: perf_counter_median_us(fns[0], reps),
        eager=lambda fn: perf_counter_median_us(fn, loop_reps),
        label="SMOKE: CPU time.perf_counter, NOT meaningful")


def bytes_moved(case: PreparedCase) -> int:
    """Bytes a gather must move: every token's values and scales read and written,
    plus the block table and ``cu_seq_lens`` read once."""
    _, table, cu = case.input_sets[0]
    payload = case.num_tokens * (HEAD_DIM + scale_bytes(HEAD_DIM))
    metadata = table.numel() * table.element_size() + cu.numel() * cu.element_size()
    return 2 * payload + metadata


def time_case(case: PreparedCase, timers: Timers, bandwidth: float | None,
              skip_loop: bool) -> dict:
    """Time one prepared case; returns its result row (times in microseconds)."""
    moved = bytes_moved(case)
    row = {"case": case.name, "requests": len(case.seq_lens), "N": case.num_tokens,
           "bytes": moved, "input_sets": len(case.input_sets)}
    log(f"[{case.name}] timing")
    row["eager_loop_us"] = None if skip_loop else timers.eager(case.loop_fn)
    for column, fn in case.compiled.items():
        row[f"{column}_us"] = timers.compiled(
            [functools.partial(fn, *inputs) for inputs in case.input_sets])
        row[f"{column}_compile_s"] = case.compile_s[column]
    row["floor_us"] = moved / bandwidth * 1e6 if bandwidth else None
    return add_ratios(row, RATIOS)


# --------------------------------------------------------------------------- CLI


def step_lens(T: int, smoke: bool) -> list[int]:
    """Context lengths of the hybrid model's step of ``T`` tokens (the gather the step runs)."""
    if smoke:
        return [T // 2, 0, T - T // 2]
    return [1000 + (b * 37) % 17 for b in range(max(1, T // 4))] if T <= 4096 else [T // 4] * 4


def report_row(T: int, s) -> dict:
    """The gather of a ``T``-token step for ``benchmarks/report.py``; eager is the vectorized
    torch form (what stock compiles), not the host-syncing loop."""
    from kda_inductor.reference import gather_indexer_k

    label = f"{T} tok step"
    case = prepare_case(label, step_lens(T, s.smoke), s.device, 1)
    timers = Timers(compiled=lambda fns: s.timer(fns[0]), eager=lambda fn: None, label="")
    row = time_case(case, timers, s.bandwidth, skip_loop=True)
    kv, table, cu = case.input_sets[0]
    row.update(rewrite="indexer_k_gather", shape=label, T=case.num_tokens,
               eager_us=s.timer(lambda: gather_indexer_k(kv, table, cu, case.num_tokens)))
    return s.ratios(row)


def report_jobs(s) -> list:
    return [lambda T=T: report_row(T, s) for T in s.sizes]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse the command line; fills mode-dependent defaults and validates ``--cases``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", help="comma-separated case names (default: all of the mode); "
                   f"GPU: {','.join(CASES)}; smoke: {','.join(SMOKE_CASES)}")
    p.add_argument("--skip-loop", action="store_true",
                   help="do not time the eager loop (it still runs once as the reference)")
    p.add_argument("--reps", type=int,
                   help="timed samples per compiled function (default 100; smoke 3)")
    p.add_argument("--inner", type=int, default=20,
                   help="graph replays per timed sample (default 20)")
    p.add_argument("--calls-per-graph", type=int, default=10,
                   help="calls captured in each CUDA graph (default 10): amortizes the host's "
                        "graph-launch cost, which otherwise dominates microsecond cases")
    p.add_argument("--loop-reps", type=int, default=3,
                   help="timed calls of the eager loop (default 3)")
    p.add_argument("--rotate", type=int, default=1,
                   help="input sets to rotate among, one CUDA graph each, to defeat L2 "
                        "(default 1: no rotation, as the anchors)")
    p.add_argument("--no-record", action="store_true",
                   help="do not write benchmarks/results/ files ($OUT is still written)")
    p.add_argument("--smoke", action="store_true",
                   help="tiny cases on CPU: correctness checks, meaningless timings, no files")
    args = p.parse_args(argv)
    available = SMOKE_CASES if args.smoke else CASES
    args.cases = args.cases.split(",") if args.cases else list(available)
    unknown = [c for c in args.cases if c not in available]
    if unknown:
        p.error(f"unknown case(s) {unknown}; choose from {list(available)}")
    if args.reps is None:
        args.reps = 3 if args.smoke else 100
    if min(args.reps, args.inner, args.loop_reps, args.rotate, args.calls_per_graph) < 1:
        p.error("--reps, --inner, --calls-per-graph, --loop-reps and --rotate must be >= 1")
    return args


def record(rows: list[dict], args: argparse.Namespace, bandwidth: float, notes: str) -> None:
    """Write the JSON to ``$OUT`` (if set) and, unless ``--no-record``, to results/."""
    env = environment_info()
    payload = {"benchmark": NAME, "env": env, "notes": notes,
               "settings": {"block_size": BLOCK_SIZE, "head_dim": HEAD_DIM,
                            "lengths_seed": LENGTHS_SEED, "reps": args.reps,
                            "inner": args.inner, "calls_per_graph": args.calls_per_graph, "loop_reps": args.loop_reps,
                            "rotate": args.rotate, "backends": BACKENDS},
               "copy_bandwidth_bytes_per_s": bandwidth, "rows": rows}
    written = [write_out_json(f"bench_{NAME}.json", payload)]
    if not args.no_record:
        written += record_results(NAME, payload, markdown_table(rows, COLUMNS),
                                  results_dir=RESULTS_DIR, title=f"{NAME} benchmark",
                                  notes=notes)
    for path in filter(None, written):
        log(f"wrote {path}")


def main(argv: list[str] | None = None) -> list[dict]:
    """Run the benchmark; returns the result rows (also printed as a table, last)."""
    args = parse_args(argv)
    configure_compile()
    import_backend()
    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("CUDA is not available; use --smoke for the CPU check")
    device = "cpu" if args.smoke else "cuda"
    case_lens = SMOKE_CASES if args.smoke else CASES
    prepared = [prepare_case(name, case_lens[name], device, args.rotate) for name in args.cases]
    if args.smoke:
        bandwidth, timers = None, cpu_timers(args.reps, args.loop_reps)
    else:
        log("measuring copy bandwidth")
        bandwidth = measure_copy_bandwidth(device)
        timers = gpu_timers(args.reps, args.inner, args.loop_reps, args.calls_per_graph)
    rows = [time_case(case, timers, bandwidth, args.skip_loop) for case in prepared]
    notes = f"Times in us. {timers.label}. Input sets: {args.rotate}."
    if not args.smoke:
        notes += f" Copy bandwidth {bandwidth / 1e12:.2f} TB/s (read + write)."
        record(rows, args, bandwidth, notes)
    print_table(rows, COLUMNS, title=f"{NAME}: {notes}")
    return rows


if __name__ == "__main__":
    main()
