"""GPU benchmark of the ``gated_norm_merge`` rewrite; results in results/gated_norm_merge.md.

The tail of a GDN layer (``examples/gdn_layers.py``): ``out = torch.empty(1, T, H, D)``, two
``index_copy_`` (three quarters of the tokens speculative), then the gated RMSNorm with silu
(flash-linear-attention spelling), H=32, D=128, bf16, T in {64, 256, 1024, 4096, 16384}.
CUDA-graph replay medians of eager, stock ``torch.compile``, kda_inductor (``gated_norm_merge``
is on by default), and the floor (spec + non-spec rows and ``z`` read, ``y``
written, at the measured copy bandwidth). The kda result is checked against eager first
(the GPU reduces in another order than eager: at most 2 bf16 ulps).
``--smoke`` runs a tiny case on CPU (checks only; timings not meaningful; nothing recorded).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE), str(_HERE.parent / "examples")]
from _timing import (  # noqa: E402
    add_ratios,
    finish,
    graph_replay_median_us,
    measure_copy_bandwidth,
    perf_counter_median_us,
    progress,
)

NAME = "gated_norm_merge"
T_VALUES = (64, 256, 1024, 4096, 16384)
COLUMNS = (("T", "T", ","), ("eager_us", "eager us", ".1f"), ("stock_us", "stock us", ".1f"),
           ("kda_us", "kda us", ".1f"), ("floor_us", "floor us", ".1f"),
           ("stock_over_floor", "stock/floor", ".2f"), ("kda_over_floor", "kda/floor", ".2f"),
           ("max_ulps", "kda vs eager, bf16 ulps", "d"))


def tail(o_spec, o_non_spec, spec_idx, non_spec_idx, z, weight):
    """The merge and the gated RMSNorm, as the example layers write them."""
    import gdn_layers as G

    T, H, D = z.shape
    out = torch.empty(1, T, H, D, dtype=o_spec.dtype, device=o_spec.device)
    out.index_copy_(1, spec_idx, o_spec)
    out.index_copy_(1, non_spec_idx, o_non_spec)
    return G.gated_rmsnorm(out.reshape(-1, D), z.reshape(-1, D), weight, 1e-6, "silu")


def tail_inputs(T: int, H: int, D: int, device):
    gen = torch.Generator().manual_seed(T)
    perm = torch.randperm(T, generator=gen)
    n_spec = 3 * T // 4
    bf = torch.bfloat16
    return (torch.randn(1, n_spec, H, D, generator=gen).to(bf).to(device),
            torch.randn(1, T - n_spec, H, D, generator=gen).to(bf).to(device),
            perm[:n_spec].to(device), perm[n_spec:].to(device),
            torch.randn(T, H, D, generator=gen).to(bf).to(device),
            (1 + 0.1 * torch.randn(D, generator=gen)).to(device))


def bytes_moved(args) -> int:
    o_s, o_ns, s, ns, z, w = args
    elems = z.numel()
    return 3 * elems * z.element_size() + (s.numel() + ns.numel()) * s.element_size() + w.numel() * w.element_size()


def run(T: int, *, smoke: bool, reps: int, bandwidth: float | None, H: int, D: int) -> dict:
    torch._dynamo.reset()  # each T compiled for its own static shapes
    device = "cpu" if smoke else "cuda"
    args = tail_inputs(T, H, D, device)
    from kda_inductor.testing import compile_for_test, max_ulps

    stock = torch.compile(tail, backend="inductor")
    checked = compile_for_test(tail)
    want = tail(*args)
    got = checked(*args)
    if checked.matches[NAME] != 1:
        raise SystemExit(f"T={T}: the rewrite did not match: {checked.matches}")
    kda = checked.compiled
    row = {"T": T, "max_ulps": max_ulps(got, want)}
    if row["max_ulps"] > (0 if smoke else 2):
        raise SystemExit(f"T={T}: kda differs from eager by {row['max_ulps']} bf16 ulps")
    timer = (lambda f: perf_counter_median_us(f, reps)) if smoke else (
        lambda f: graph_replay_median_us(f, reps=reps, calls=10))
    row.update(eager_us=timer(lambda: tail(*args)), stock_us=timer(lambda: stock(*args)),
               kda_us=timer(lambda: kda(*args)))
    if bandwidth:
        row["floor_us"] = bytes_moved(args) / bandwidth * 1e6
        add_ratios(row, (("stock_over_floor", "stock_us", "floor_us"), ("kda_over_floor", "kda_us", "floor_us")))
    return row


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--T", default=",".join(map(str, T_VALUES)))
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--no-record", action="store_true")
    p.add_argument("--smoke", action="store_true", help="tiny CPU run: checks only")
    args = p.parse_args(argv)
    if args.smoke:
        Ts, reps, H, D = [12], args.reps or 2, 2, 16
    else:
        if not torch.cuda.is_available():
            raise SystemExit("needs a CUDA GPU (use --smoke on CPU)")
        Ts, reps, H, D = [int(t) for t in args.T.split(",")], args.reps or 100, 32, 128
    torch._inductor.config.force_disable_caches = True
    import kda_inductor  # noqa: F401  (the backend, when not pip-installed)

    bandwidth = None if args.smoke else measure_copy_bandwidth("cuda")
    t0 = time.perf_counter()
    rows = []
    for T in Ts:
        rows.append(run(T, smoke=args.smoke, reps=reps, bandwidth=bandwidth, H=H, D=D))
        progress(rows[-1])
    notes = ("NOT meaningful (CPU smoke run)" if args.smoke else
             f"CUDA-graph replay medians, 10 calls per graph, per call; copy bandwidth "
             f"{bandwidth / 1e12:.2f} TB/s; H={H}, D={D}, bf16, three quarters of the tokens speculative")
    finish(NAME, rows, COLUMNS, notes, smoke=args.smoke, record=not args.no_record,
           results_dir=_HERE / "results", started=t0)
    return rows


if __name__ == "__main__":
    main()
