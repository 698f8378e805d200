"""Sweep the indexer_k_write Triton kernel's tokens per program and num_warps on a GPU.

Times ``write_triton`` alone (LayerNorm + ue8m0 quant + write, head_dim 128, block 64) by
CUDA-graph replay for T in {1, 64, 2048, 16384}, with the hardware casts (the default on
CUDA) and, for the default launch, with the integer roundings the interpreter uses; plus a
plain SM copy of the same bytes. Used to pick ``default_block_t`` / the warps rule.
    python benchmarks/tune_indexer_k_write.py [--T 1,16384]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import graph_replay_median_us, print_table, sm_copy_us  # noqa: E402
from bench_indexer_k_write import CASES, bytes_moved, make_inputs  # noqa: E402

from kda_inductor.lowerings.indexer_k_write import write_triton  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--T", default=",".join(map(str, CASES)))
    p.add_argument("--block-t", default="1,2,4,8,16")
    p.add_argument("--warps", default="1,2,4")
    args = p.parse_args(argv)
    rows = []
    for T in map(int, args.T.split(",")):
        k, w, b, cache, slots = make_inputs(T, "cuda")
        exact = cache.clone()
        write_triton(cache, k, slots, w, b, 1e-6, True)
        write_triton(exact, k, slots, w, b, 1e-6, True, hw_casts=False)
        assert torch.equal(cache, exact), "hardware casts differ from the integer roundings"

        def call(**kw):
            write_triton(cache, k, slots, w, b, 1e-6, True, **kw)

        for bt, nw in itertools.product(map(int, args.block_t.split(",")), map(int, args.warps.split(","))):
            rows.append({"T": T, "cfg": f"block_t={bt} warps={nw}", "us": graph_replay_median_us(
                lambda: call(block_t=bt, num_warps=nw), reps=50, calls=10)})
        rows.append({"T": T, "cfg": "default", "us": graph_replay_median_us(call, reps=50, calls=10)})
        rows.append({"T": T, "cfg": "default, integer roundings", "us": graph_replay_median_us(
            lambda: call(hw_casts=False), reps=50, calls=10)})
        rows.append({"T": T, "cfg": "plain SM copy of the bytes", "us": sm_copy_us(bytes_moved(T))})
    best = {}
    for r in rows:
        if r["cfg"].startswith("block_t") and (r["T"] not in best or r["us"] < best[r["T"]]["us"]):
            best[r["T"]] = r
    print_table(rows, [("T", "T", ","), ("cfg", "config", ""), ("us", "us", ".2f")],
                title="indexer_k_write kernel sweep")
    print_table(list(best.values()), [("T", "T", ","), ("cfg", "best config", ""), ("us", "us", ".2f")],
                title="best per T")


if __name__ == "__main__":
    main()
