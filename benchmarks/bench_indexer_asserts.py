"""GPU benchmark: what the device-side asserts of the indexer kernels cost.

Times the two launchers directly, with the asserts (``check=True``: what the ops always
run) and without (``check=False``: the explicit no-assert variant, for this measurement
only), by CUDA-graph replay (``_timing``; ``--calls-per-graph`` calls per graph, per call):

* ``gather_triton``: prefill gathers of 4 / 64 / 256 requests x ~1000 tokens (the
  ``bench_indexer_k_gather`` cases, block 64, head_dim 128), the launcher's own grid;
  ``--grids`` adds rows for the by-token and by-block grids forced;
* ``write_triton``: quant (ue8m0) + write of T = 1 / 64 / 2048 / 16384 tokens (block 64,
  head_dim 128), and the same with ``wrap_negative=True``.

Before timing, both variants must write the same bytes (a mismatch raises). Columns:
``check`` / ``no check`` us, their difference and ratio.

``--smoke`` runs tiny cases on CPU under the Triton interpreter (set ``TRITON_INTERPRET=1``
yourself; no CUDA): same checks, timings NOT meaningful, nothing recorded.

Usage: ``python benchmarks/bench_indexer_asserts.py [--reps N] [--grids] [--no-record] [--smoke]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))
if str(_HERE.parent) not in sys.path:
    sys.path.append(str(_HERE.parent))

from _timing import (  # noqa: E402
    environment_info,
    graph_replay_median_us,
    markdown_table,
    perf_counter_median_us,
    print_table,
    record_results,
    write_out_json,
)
from bench_indexer_k_gather import request_lengths  # noqa: E402
from kda_inductor.reference import cache_row_bytes, random_indexer_cache, scale_bytes  # noqa: E402

NAME = "indexer_asserts"
RESULTS_DIR = _HERE / "results"
BLOCK_SIZE, HEAD_DIM = 64, 128
GATHER_CASES = {"4req": 4, "64req": 64, "256req": 256}
WRITE_CASES = (1, 64, 2048, 16384)
COLUMNS = (
    ("op", "op", "s"),
    ("case", "case", "s"),
    ("check_us", "check us", ".2f"),
    ("no_check_us", "no check us", ".2f"),
    ("cost_us", "cost us", "+.2f"),
    ("ratio", "check/no check", ".3f"),
)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def gather_rows(device, timer, smoke: bool, grids: bool) -> list[dict]:
    from kda_inductor.lowerings.indexer_k_gather import gather_triton

    cases = {"tiny": [70, 0, 5]} if smoke else {k: request_lengths(n) for k, n in GATHER_CASES.items()}
    rows = []
    for name, lens in cases.items():
        g = torch.Generator().manual_seed(0)
        kv, bt, cu, n = random_indexer_cache(lens, BLOCK_SIZE, HEAD_DIM, device=device, generator=g)
        for grid_by in ("auto", "token", "block") if grids else ("auto",):
            outs = {}
            for check in (True, False):
                dv = torch.full((n, HEAD_DIM), 0xAB, dtype=torch.uint8, device=device)
                ds = torch.full((n, scale_bytes(HEAD_DIM)), 0xAB, dtype=torch.uint8, device=device)

                def fn(dv=dv, ds=ds, check=check):
                    gather_triton(kv, bt, cu, dv, ds, grid_by=grid_by, check=check,
                                  block_t=16 if smoke else None)

                fn()
                outs[check] = (fn, dv.clone(), ds.clone())
            if not (torch.equal(outs[True][1], outs[False][1]) and torch.equal(outs[True][2], outs[False][2])):
                raise AssertionError(f"gather {name} {grid_by}: check and no-check variants differ")
            label = f"{name} (N={n:,})" + ("" if grid_by == "auto" else f" {grid_by} grid")
            log(f"timing gather {label}")
            rows.append(_row("gather", label, timer(outs[True][0]), timer(outs[False][0])))
    return rows


def write_rows(device, timer, smoke: bool) -> list[dict]:
    from kda_inductor.lowerings.indexer_k_write import write_triton

    rows = []
    for t in (1, 24) if smoke else WRITE_CASES:
        num_blocks = max(4, 2 * -(-t // BLOCK_SIZE))
        g = torch.Generator().manual_seed(t)
        k = (torch.randn(t, HEAD_DIM, generator=g) * 3).to(torch.bfloat16).to(device)
        slots = torch.randperm(num_blocks * BLOCK_SIZE, generator=g)[:t]
        for wrap in (False, True):
            s = slots.clone()
            if wrap:  # half the slots counted from the end: the same places
                s[::2] -= num_blocks * BLOCK_SIZE
            s = s.to(device)
            outs = {}
            for check in (True, False):
                cache = torch.randint(0, 256, (num_blocks, BLOCK_SIZE, cache_row_bytes(HEAD_DIM)), dtype=torch.uint8,
                                      generator=torch.Generator().manual_seed(1)).to(device)

                def fn(cache=cache, check=check, s=s, wrap=wrap):
                    write_triton(cache, k, s, ue8m0=True, wrap_negative=wrap, check=check)

                fn()
                outs[check] = (fn, cache.clone())
            if not torch.equal(outs[True][1], outs[False][1]):
                raise AssertionError(f"write T={t} wrap={wrap}: check and no-check variants differ")
            label = f"T={t}" + (" wrap_negative" if wrap else "")
            log(f"timing write {label}")
            rows.append(_row("write", label, timer(outs[True][0]), timer(outs[False][0])))
    return rows


def _row(op, case, check_us, no_check_us) -> dict:
    return {"op": op, "case": case, "check_us": check_us, "no_check_us": no_check_us,
            "cost_us": check_us - no_check_us, "ratio": check_us / no_check_us if no_check_us else None}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, help="timed samples per variant (default 100; smoke 2)")
    p.add_argument("--inner", type=int, default=20, help="graph replays per timed sample (default 20)")
    p.add_argument("--calls-per-graph", type=int, default=10, help="calls captured per CUDA graph (default 10)")
    p.add_argument("--grids", action="store_true", help="also time the gather's by-token and by-block grids forced")
    p.add_argument("--no-record", action="store_true", help="do not write benchmarks/results/ files")
    p.add_argument("--smoke", action="store_true", help="tiny cases on CPU (interpreter): checks only")
    args = p.parse_args(argv)
    args.reps = args.reps or (2 if args.smoke else 100)
    return args


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("CUDA is not available; use --smoke for the CPU check")
    if args.smoke:
        device = "cpu"
        timer = lambda fn: perf_counter_median_us(fn, args.reps)  # noqa: E731
        label = "SMOKE: CPU time.perf_counter under the interpreter, NOT meaningful"
    else:
        device = "cuda"
        timer = lambda fn: graph_replay_median_us(  # noqa: E731
            fn, reps=args.reps, inner=args.inner, calls=args.calls_per_graph)
        label = (f"CUDA-graph replay median ({args.reps} x {args.inner} replays of graphs of "
                 f"{args.calls_per_graph} calls, per call)")
    rows = gather_rows(device, timer, args.smoke, args.grids) + write_rows(device, timer, args.smoke)
    notes = (f"Times in us. {label}. Launchers alone; check: the device-side asserts the ops run "
             f"(debug-mode Triton, overflow checks off), no check: check=False. Block {BLOCK_SIZE}, "
             f"head_dim {HEAD_DIM}; write: ue8m0 quant + write, no norm.")
    if not args.smoke:
        payload = {"benchmark": NAME, "env": environment_info(), "notes": notes,
                   "settings": {"block_size": BLOCK_SIZE, "head_dim": HEAD_DIM, "reps": args.reps,
                                "inner": args.inner, "calls_per_graph": args.calls_per_graph},
                   "rows": rows}
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
