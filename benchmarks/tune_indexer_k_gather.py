"""Sweep the indexer_k_gather Triton kernel's tile (BLOCK_T) and num_warps on a GPU.

Times ``gather_triton`` alone by CUDA-graph replay on the benchmark's cases and
prints one row per config; used to pick ``DEFAULT_BLOCK_T`` and the num_warps rule.
    python benchmarks/tune_indexer_k_gather.py [--cases seed,4req]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import graph_replay_median_us, print_table, sm_copy_us  # noqa: E402
from bench_indexer_k_gather import CASES  # noqa: E402

from kda_inductor.lowerings.indexer_k_gather import gather_triton  # noqa: E402
from kda_inductor.reference import random_indexer_cache, scale_bytes  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--cases", default="seed,4req")
    p.add_argument("--block-t", default="16,32,64,128")
    p.add_argument("--warps", default="1,2,4,8")
    p.add_argument("--fanout", default="16")
    p.add_argument("--grid-by", default="block,token")
    args = p.parse_args(argv)
    rows = []
    for name in args.cases.split(","):
        cache, table, cu, n = random_indexer_cache(CASES[name], 64, 128, device="cuda")
        dv = torch.empty(n, 128, dtype=torch.uint8, device="cuda")
        ds = torch.empty(n, scale_bytes(128), dtype=torch.uint8, device="cuda")
        configs = itertools.product(
            map(int, args.fanout.split(",")), args.grid_by.split(","),
            map(int, args.block_t.split(",")), map(int, args.warps.split(",")),
        )
        for fanout, grid_by, bt, w in configs:
            def fn():
                return gather_triton(cache, table, cu, dv, ds, block_t=bt, num_warps=w,
                                     fanout=fanout, grid_by=grid_by)

            us = graph_replay_median_us(fn, reps=50, calls=10)
            rows.append({"case": name, "N": n, "fanout": fanout, "grid_by": grid_by, "block_t": bt,
                         "warps": w, "us": us})
        # the bytes of this gather moved by a plain SM copy kernel: the achievable floor
        rows.append({"case": name, "N": n, "fanout": "plain copy",
                     "us": sm_copy_us(2 * n * (128 + scale_bytes(128)))})
        rows.append({"case": name, "N": n, "fanout": "default", "us": graph_replay_median_us(
            lambda: gather_triton(cache, table, cu, dv, ds), reps=50, calls=10)})
    print_table(rows, [("case", "case", ""), ("N", "N", ","), ("fanout", "fanout", ""), ("grid_by", "grid", ""), ("block_t", "BLOCK_T", ""),
                       ("warps", "warps", ""), ("us", "us", ".2f")], title="indexer_k_gather kernel sweep")


if __name__ == "__main__":
    main()
