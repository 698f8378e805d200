"""GPU benchmark: the merge-free gated RMSNorm at a SYMBOLIC token count, as vLLM compiles it.

vLLM traces ``RMSNormGated.forward_native`` (``forward_static``: ``x.float()``, ``weight.float()``,
``z.float()``, ``x * rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)``, ``* weight``, ``* silu(z)``,
``.to(bf16)``) in ``_output_projection`` on ``core_attn_out [T, H, D]`` and the gate ``z``, a
``[T, H, D]`` view of the input projection's split, with one graph for every ``T`` (the token
dim marked dynamic). This times, per head count ``H`` and ``T`` from 1 to 16384 (D=128, bf16):

* ``stock``: Inductor's code for that graph, compiled once with ``T`` dynamic (``T=1`` is its
  own static graph, as Dynamo specializes size 1);
* ``kda``: the same graph compiled with ``backend="kda_inductor"`` and the rewrite forced,
  i.e. ``kda::gated_norm_merge``'s merge-free kernel (``norm_rows_triton``) with its default
  launch configuration;
* ``sweep``: ``norm_rows_triton`` launched directly with every ``(BLOCK_M, num_warps)`` of
  ``--blocks`` x ``--warps`` (the best is reported, and the whole sweep goes to the JSON);
* the floor: bytes read and written once (x, z, y) at the measured copy bandwidth.

CUDA-graph replay medians, 10 calls per graph. Results: results/gated_norm_symbolic.md/.json.
``--smoke`` runs tiny sizes on CPU (checks only, nothing recorded).
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE)]
from _timing import (  # noqa: E402
    add_ratios,
    finish,
    graph_replay_median_us,
    kernel_profile,
    measure_copy_bandwidth,
    perf_counter_median_us,
    progress,
)

NAME = "gated_norm_symbolic"
T_VALUES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
H_VALUES = (32, 16, 64)
"""Qwen3-Next-80B's 32 value heads at TP1, 16 at TP2; 64 for wider GDN models (Qwen3.5)."""
COLUMNS = (("H", "H", "d"), ("T", "T", ","), ("stock_us", "stock us", ".2f"), ("kda_us", "kda us", ".2f"),
           ("best_us", "best sweep us", ".2f"), ("best", "best (BLOCK_M, warps)", ""),
           ("floor_us", "floor us", ".2f"), ("kda_over_stock", "kda/stock", ".3f"),
           ("max_ulps", "kda vs eager, ulps", "d"))


def vllm_norm(core_attn_out, z, weight, eps: float = 1e-6):
    """``RMSNormGated.forward_static`` with ``norm_before_gate=True``, no group, silu gate."""
    orig_dtype = core_attn_out.dtype
    x = core_attn_out.float()
    weight = weight.float()
    z = z.float()
    variance = x.pow(2).mean(dim=-1, keepdim=True)
    x_normed = x * torch.rsqrt(variance + eps)
    out = x_normed * weight
    out = out * F.silu(z)
    return out.to(orig_dtype).flatten(-2)


def inputs(T: int, H: int, D: int, device):
    g = torch.Generator().manual_seed(T * 131 + H)
    bf = torch.bfloat16
    x = torch.randn(T, H, D, generator=g).to(bf).to(device)
    proj = torch.randn(T, 2 * H * D, generator=g).to(bf).to(device)  # [q k v | z] as the split reads it
    z = proj[:, H * D:].view(T, H, D)
    w = (1 + 0.1 * torch.randn(D, generator=g)).to(bf).to(device)
    return x, z, w


def _compiled(backend: str, options=None):
    fn = torch.compile(vllm_norm, backend=backend, options=options)

    def call(x, z, w):
        torch._dynamo.mark_dynamic(x, 0)
        torch._dynamo.mark_dynamic(z, 0)
        return fn(x, z, w)
    return call


def run_h(H: int, t_values, *, smoke: bool, reps: int, bandwidth, blocks, warps, D: int,
          profile: bool = False) -> list[dict]:
    from kda_inductor.lowerings import gated_norm_merge as L
    from kda_inductor.pass_manager import counted
    from kda_inductor.testing import max_ulps

    torch._dynamo.reset()
    device = "cpu" if smoke else "cuda"
    stock = _compiled("inductor")
    kda = _compiled("kda_inductor", {"kda": {"force": True, "strict": True}})
    rows = []
    for T in t_values:
        x, z, w = inputs(T, H, D, device)
        want = vllm_norm(x, z, w)
        with counted() as made:
            got = kda(x, z, w)
        if T > 1 and T == t_values[1] and made.get("gated_norm_merge", 0) != 1:
            raise SystemExit(f"H={H} T={T}: the rewrite did not fire at a symbolic T: {made}")
        row = {"H": H, "T": T, "max_ulps": max_ulps(got, want)}
        if row["max_ulps"] > 2:
            raise SystemExit(f"H={H} T={T}: kda differs from eager by {row['max_ulps']} ulps")
        timer = (lambda f: perf_counter_median_us(f, 2)) if smoke else (
            lambda f: graph_replay_median_us(f, reps=reps, calls=10))
        row["stock_us"] = timer(lambda: stock(x, z, w))
        row["kda_us"] = timer(lambda: kda(x, z, w))
        y = torch.empty(T * H, D, dtype=x.dtype, device=device)
        sweep = {}
        for bm, nw in itertools.product(blocks, warps):
            if bm * D > 8192:
                continue
            launch = (lambda bm=bm, nw=nw: L.norm_rows_triton(x.view(T, H * D), z, w, y, eps=1e-6, activation="silu",
                                                              form="fla", rsqrt=True, block_m=bm, num_warps=nw))
            launch()
            if max_ulps(y, want.view(T * H, D)) > 2:
                raise SystemExit(f"H={H} T={T} BLOCK_M={bm} warps={nw}: wrong result")
            sweep[f"{bm}x{nw}"] = timer(launch)
        best = min(sweep, key=sweep.get)
        row.update(best=best, best_us=sweep[best], sweep=sweep, default=list(L.rows_config(T * H, D)))
        if bandwidth:
            row["floor_us"] = 3 * x.numel() * x.element_size() / bandwidth * 1e6
        add_ratios(row, (("kda_over_stock", "kda_us", "stock_us"),))
        rows.append(row)
        progress({k: v for k, v in row.items() if k != "sweep"})
        if profile and T == max(t_values):
            for label, f in (("stock", stock), ("kda", kda)):
                print(f"H={H} T={T} {label}: {kernel_times(lambda: f(x, z, w))}", flush=True)
    return rows


def kernel_times(fn, calls: int = 5) -> list[tuple[str, float]]:
    """The six longest GPU kernels one call of ``fn`` launches, with their mean microseconds."""
    per_kernel = kernel_profile(fn, calls=calls, warmup=1)
    return sorted(((k[:60], round(us, 2)) for k, (us, _) in per_kernel.items()), key=lambda kv: -kv[1])[:6]


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--T", default=None)
    p.add_argument("--H", default=None)
    p.add_argument("--blocks", default="1,2,4,8,16,32")
    p.add_argument("--warps", default="1,2,4,8")
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--no-record", action="store_true")
    p.add_argument("--smoke", action="store_true", help="tiny CPU run: checks only")
    p.add_argument("--profile", action="store_true", help="print the kernels of stock and kda at the largest T")
    args = p.parse_args(argv)
    ints = lambda s: tuple(int(v) for v in s.split(","))  # noqa: E731
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # the sweep's kernels on CPU tensors
        t_values, h_values, D, reps = (1, 3, 5), (2,), 16, 2
        blocks, warps = (1, 4), (1,)
    else:
        if not torch.cuda.is_available():
            raise SystemExit("needs a CUDA GPU (use --smoke on CPU)")
        t_values = ints(args.T) if args.T else T_VALUES
        h_values = ints(args.H) if args.H else H_VALUES
        D, reps, blocks, warps = 128, args.reps or 50, ints(args.blocks), ints(args.warps)
    torch._inductor.config.force_disable_caches = True
    import kda_inductor  # noqa: F401  (the backend, when not pip-installed)

    bandwidth = None if args.smoke else measure_copy_bandwidth("cuda")
    t0 = time.perf_counter()
    rows = []
    with torch.inference_mode():
        for H in h_values:
            rows += run_h(H, t_values, smoke=args.smoke, reps=reps, bandwidth=bandwidth, blocks=blocks,
                          warps=warps, D=D, profile=args.profile and not args.smoke)
    notes = ("NOT meaningful (CPU smoke run)" if args.smoke else
             f"CUDA-graph replay medians, 10 calls per graph, per call; copy bandwidth {bandwidth / 1e12:.2f} TB/s; "
             f"vLLM's RMSNormGated.forward_native spelling, D={D}, bf16, gate a strided view of the projection; "
             f"stock and kda compiled once per H with T dynamic (T=1 static); kda forced")
    finish(NAME, rows, COLUMNS, notes, smoke=args.smoke, record=not args.no_record,
           results_dir=_HERE / "results", started=t0)
    return rows


if __name__ == "__main__":
    main()
