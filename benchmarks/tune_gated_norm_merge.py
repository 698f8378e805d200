"""Sweep the gated_norm_merge Triton kernel's rows per program and num_warps on a GPU.

Times ``norm_merge_triton`` alone (H=32, D=128, bf16, fla form, silu) by CUDA-graph replay,
plus a plain SM copy of the same bytes; used to pick ``rows_per_program`` / the warps rule.
    python benchmarks/tune_gated_norm_merge.py [--T 256,16384]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import graph_replay_median_us, print_table  # noqa: E402
from bench_gated_norm_merge import T_VALUES, bytes_moved, tail_inputs  # noqa: E402

from kda_inductor.lowerings.gated_norm_merge import norm_merge_triton  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--T", default=",".join(map(str, T_VALUES)))
    p.add_argument("--block-r", default="1,2,4,8,16,32")
    p.add_argument("--warps", default="2,4,8")
    args = p.parse_args(argv)
    rows = []
    for T in map(int, args.T.split(",")):
        a = tail_inputs(T, 32, 128, "cuda")
        o_s, o_ns, s, ns, z, w = a
        srcs, z2 = [o_s.reshape(o_s.shape[1], -1), o_ns.reshape(o_ns.shape[1], -1)], z.reshape(-1, 128)
        y = torch.empty_like(z2)

        def call(**kw):
            return norm_merge_triton(srcs, [s, ns], z2, w, y, eps=1e-6, activation="silu", form="fla",
                                     rsqrt=True, num_tokens=T, **kw)

        for br, nw in itertools.product(map(int, args.block_r.split(",")), map(int, args.warps.split(","))):
            rows.append({"T": T, "cfg": f"block_r={br} warps={nw}", "us": graph_replay_median_us(
                lambda: call(block_r=br, num_warps=nw), reps=50, calls=10)})
        rows.append({"T": T, "cfg": "default", "us": graph_replay_median_us(call, reps=50, calls=10)})
        src = torch.empty(bytes_moved(a) // 8, dtype=torch.int32, device="cuda")
        dst = torch.empty_like(src)
        rows.append({"T": T, "cfg": "plain SM copy of the bytes", "us": graph_replay_median_us(
            lambda: torch.bitwise_or(src, 0, out=dst), reps=50, calls=10)})
    print_table(rows, [("T", "T", ","), ("cfg", "config", ""), ("us", "us", ".2f")],
                title="gated_norm_merge kernel sweep")


if __name__ == "__main__":
    main()
