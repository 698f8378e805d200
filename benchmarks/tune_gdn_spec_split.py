"""Sweep the gdn_spec_split Triton kernel's BLOCK_W, num_warps and column programs per row.

Times ``split_triton`` alone (the six Qwen3-Next gathers) by CUDA-graph replay, plus the
shipped default and a plain SM copy of the same bytes. Used to pick the defaults in
``kda_inductor/lowerings/gdn_spec_split.py``.
    python benchmarks/tune_gdn_spec_split.py [--T 256,16384]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import graph_replay_median_us, print_table, sm_copy_us  # noqa: E402
from bench_gdn_spec_split import T_VALUES, bytes_moved, split_inputs  # noqa: E402

from kda_inductor.lowerings.gdn_spec_split import split_triton  # noqa: E402


def _call(args, outs, **kw):
    qkv, g, beta, s, ns = args
    return split_triton([qkv, qkv, g, g, beta, beta], [s, ns], [0, 0, 1, 1, 1, 1], [0, 1] * 3, outs, **kw)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--T", default=",".join(map(str, T_VALUES)))
    p.add_argument("--block-w", default="512,1024,2048")
    p.add_argument("--warps", default="2,4,8")
    p.add_argument("--cols", default="1,2,4,8,16")
    args = p.parse_args(argv)
    rows = []
    for T in map(int, args.T.split(",")):
        a = split_inputs(T, 8192, 32, "cuda")
        want = [a[0][a[3]], a[0][a[4]], a[1][:, a[3]], a[1][:, a[4]], a[2][:, a[3]], a[2][:, a[4]]]
        outs = [torch.empty_like(w) for w in want]
        _call(a, outs)
        for o, w in zip(outs, want):
            assert torch.equal(o, w), "kernel output differs from indexing"
        for bw, w, c in itertools.product(map(int, args.block_w.split(",")), map(int, args.warps.split(",")),
                                          map(int, args.cols.split(","))):
            if c > 1 and -(-8192 // bw) < c:
                continue
            us = graph_replay_median_us(lambda: _call(a, outs, block_w=bw, num_warps=w, col_programs=c),
                                        reps=50, calls=10)
            rows.append({"T": T, "cfg": f"bw={bw} w={w} cols={c}", "us": us})
        rows.append({"T": T, "cfg": "default", "us": graph_replay_median_us(
            lambda: _call(a, outs), reps=50, calls=10)})
        rows.append({"T": T, "cfg": "plain SM copy of the bytes", "us": sm_copy_us(bytes_moved(a))})
    best = {}
    for r in rows:
        if r["cfg"].startswith("bw=") and (r["T"] not in best or r["us"] < best[r["T"]]["us"]):
            best[r["T"]] = r
    print_table(rows, [("T", "T", ","), ("cfg", "config", ""), ("us", "us", ".2f")],
                title="gdn_spec_split kernel sweep")
    print_table(list(best.values()), [("T", "T", ","), ("cfg", "best config", ""), ("us", "us", ".2f")],
                title="best per T")


if __name__ == "__main__":
    main()
