"""Sweep the gated_norm_merge Triton kernel's rows per program and num_warps on a GPU.

Times ``norm_merge_triton`` alone (H=32, D=128, bf16, fla form, silu) by CUDA-graph replay,
plus a plain SM copy of the same bytes; used to pick ``rows_per_program`` / the warps rule.
``--merge-free`` times the plain gated RMSNorm of a contiguous tensor instead: stock
``torch.compile``'s fusion of it against the kernel run on it (one source, identity
index), the measurement behind leaving that case to Inductor.
    python benchmarks/tune_gated_norm_merge.py [--T 256,16384] [--merge-free]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import graph_replay_median_us, print_table, sm_copy_us  # noqa: E402
from bench_gated_norm_merge import T_VALUES, bytes_moved, tail_inputs  # noqa: E402

from kda_inductor.lowerings.gated_norm_merge import norm_merge_triton  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--T", default=",".join(map(str, T_VALUES)))
    p.add_argument("--block-r", default="1,2,4,8,16,32")
    p.add_argument("--warps", default="2,4,8")
    p.add_argument("--merge-free", action="store_true")
    args = p.parse_args(argv)
    if args.merge_free:
        return merge_free([int(t) for t in args.T.split(",")])
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
        rows.append({"T": T, "cfg": "plain SM copy of the bytes", "us": sm_copy_us(bytes_moved(a))})
    print_table(rows, [("T", "T", ","), ("cfg", "config", ""), ("us", "us", ".2f")],
                title="gated_norm_merge kernel sweep")


def merge_free(Ts):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    import gdn_layers as G

    from kda_inductor.testing import compile_for_test, max_ulps

    torch._inductor.config.force_disable_caches = True
    rows = []
    for T in Ts:
        torch._dynamo.reset()
        g = torch.Generator().manual_seed(T)
        x, z = (torch.randn(T * 32, 128, generator=g).to(torch.bfloat16).cuda() for _ in range(2))
        w = (1 + 0.1 * torch.randn(128, generator=g)).cuda()
        y = torch.empty_like(z)

        def kernel():  # one source, no indices: the merge-free path of the op
            return norm_merge_triton([x.view(T, -1)], [], z, w, y, eps=1e-6, activation="silu", form="fla",
                                     rsqrt=True, num_tokens=T)

        def norm(x, z, w):
            return G.gated_rmsnorm(x, z, w, 1e-6, "silu")

        stock = torch.compile(norm, backend="inductor")
        kda = compile_for_test(norm)
        want = stock(x, z, w)
        got = kda(x, z, w)
        kernel()
        for out in (y, got):
            assert max_ulps(out, want) <= 2, "kernel differs from Inductor by more than 2 ulps"
        rows.append({"T": T, "stock_us": graph_replay_median_us(lambda: stock(x, z, w), reps=50, calls=10),
                     "kernel_us": graph_replay_median_us(kernel, reps=50, calls=10),
                     "kda_us": graph_replay_median_us(lambda: kda.compiled(x, z, w), reps=50, calls=10),
                     "matched": kda.matches["gated_norm_merge"]})
    print_table(rows, [("T", "T", ","), ("stock_us", "stock torch.compile us", ".2f"),
                       ("kernel_us", "kernel alone us", ".2f"), ("kda_us", "kda_inductor us", ".2f"),
                       ("matched", "rewritten", "d")], title="merge-free gated RMSNorm, H=32, D=128, bf16")
    return rows


if __name__ == "__main__":
    main()
