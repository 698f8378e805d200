"""``gated_norm_quant`` on a GPU: vLLM's gated RMSNorm + dynamic fp8 group quantization (a GDN
layer's output projection in an FP8 checkpoint) at T tokens, H=32 value heads of D=128:
eager, stock ``torch.compile`` and kda_inductor (forced: the speed rule waits for this very
measurement), each compiled once with T dynamic and once static per T, against the floor (bytes
read and written over the measured copy bandwidth). CUDA-graph replay medians.

    python benchmarks/bench_gated_norm_quant.py [--T 1,256,16384] [--reps 50] [--no-record]
    python benchmarks/bench_gated_norm_quant.py --smoke     # CPU, tiny, checks only

Results: ``benchmarks/results/gated_norm_quant.{md,json}``; the pattern's speed rule cites them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE), str(_HERE.parent)]
from _timing import (  # noqa: E402
    add_ratios,
    finish,
    graph_replay_median_us,
    measure_copy_bandwidth,
    perf_counter_median_us,
    progress,
)

NAME = "gated_norm_quant"
T_VALUES = (1, 2, 4, 16, 64, 256, 1024, 4096, 16384)
FP8_MAX, MIN_SCALE = 448.0, 1.0 / (448.0 * 512.0)
COLUMNS = (("T", "T", ","), ("shape", "shape", "s"), ("eager_us", "eager us", ".2f"), ("stock_us", "stock us", ".2f"),
           ("kda_us", "kda us", ".2f"), ("floor_us", "floor us", ".2f"), ("kda_over_stock", "kda/stock", ".3f"),
           ("kda_over_floor", "kda/floor", ".2f"))


def norm_quant(x, z, w, eps=1e-6):
    """vLLM's ``RMSNormGated.forward_native`` then ``QuantFP8`` per group of 128 (forward_native)."""
    dtype = x.dtype
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float() * F.silu(z.float())).to(dtype)
    y = y.flatten(-2)
    xg = y.view(-1, y.shape[-1] // 128, 128)
    s = (xg.abs().max(dim=-1, keepdim=True)[0].float() / FP8_MAX).clamp(min=MIN_SCALE)
    return (xg / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(y.shape), s.squeeze(-1)


def inputs(T: int, H: int, D: int, device, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, D, generator=g).to(torch.bfloat16).to(device)
    proj = torch.randn(T, 2 * H * D, generator=g).to(torch.bfloat16).to(device)  # the gate: a split of it
    w = (1 + 0.1 * torch.randn(D, generator=g)).to(torch.bfloat16).to(device)
    return x, proj[:, H * D:].view(T, H, D), w


def bytes_moved(T: int, H: int, D: int) -> int:
    return T * H * D * (2 + 2 + 1) + T * H * D // 128 * 4 + D * 2


def check(label: str, got, want) -> None:
    (q, s), (qe, se) = got, want
    assert torch.equal(s, se), f"{label}: scales differ"
    a, e = q.float(), qe.float()
    step = torch.pow(2.0, torch.floor(torch.log2(e.abs().clamp(min=2.0**-6))) - 3)
    assert bool(((a - e).abs() <= step).all()), f"{label}: values more than one fp8 step apart"


def compiled(backend: str):
    options = {"kda": {"force": True}} if backend == "kda_inductor" else None
    return torch.compile(norm_quant, backend=backend, options=options)


def run(T: int, *, H: int, D: int, device, timer, bandwidth, dynamic: bool, fns=None) -> dict:
    args = inputs(T, H, D, device)
    if dynamic:  # the token count only, as vLLM marks it (one graph for every T > 1)
        for t in args[:2]:
            torch._dynamo.mark_dynamic(t, 0)
    stock, kda = fns if fns is not None else (compiled("inductor"), compiled("kda_inductor"))
    from kda_inductor import pass_manager

    want = norm_quant(*args)
    with torch.inference_mode():
        check(f"T={T} stock", stock(*args), want)
        with pass_manager.counted() as made:
            check(f"T={T} kda", kda(*args), want)
        if fns is None or T == 2:  # this call compiled: the op must be in the graph
            assert made.get(NAME) == 1, f"T={T}: {NAME} not rewritten ({made})"
        row = {"T": T, "shape": f"H={H} D={D} {'dynamic' if dynamic else 'static'} T",
               "eager_us": timer(lambda: norm_quant(*args)), "stock_us": timer(lambda: stock(*args)),
               "kda_us": timer(lambda: kda(*args))}
    if bandwidth:
        row["floor_us"] = bytes_moved(T, H, D) / bandwidth * 1e6
    return add_ratios(row, (("kda_over_stock", "kda_us", "stock_us"), ("kda_over_floor", "kda_us", "floor_us")))


def report_jobs(s) -> list:
    """``benchmarks/report.py``'s rows: static T at its sizes (``s``: its ``Settings``)."""
    H, D = (2, 128) if s.smoke else (32, 128)
    return [lambda T=T: {"rewrite": NAME, **run(T, H=H, D=D, device=s.device, timer=s.timer, bandwidth=s.bandwidth,
                                                dynamic=False)} for T in s.sizes]


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--T", default=None)
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--no-record", action="store_true")
    p.add_argument("--smoke", action="store_true", help="tiny CPU run: checks only")
    args = p.parse_args(argv)
    t_values = (1, 2, 8) if args.smoke else tuple(int(v) for v in (args.T or ",".join(map(str, T_VALUES))).split(","))
    H, D = (2, 128) if args.smoke else (32, 128)
    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (use --smoke on CPU)")
    timer = ((lambda fn: perf_counter_median_us(fn, 1)) if args.smoke
             else (lambda fn: graph_replay_median_us(fn, reps=args.reps, inner=10)))
    bandwidth = None if args.smoke else measure_copy_bandwidth(device)
    torch._inductor.config.force_disable_caches = True
    t0, rows = time.perf_counter(), []
    for T in t_values:  # static T: compiled per T
        torch._dynamo.reset()
        rows.append(run(T, H=H, D=D, device=device, timer=timer, bandwidth=bandwidth, dynamic=False))
        progress(rows[-1])
    torch._dynamo.reset()
    symbolic = (compiled("inductor"), compiled("kda_inductor"))  # one graph for every T > 1
    for T in t_values:
        rows.append(run(T, H=H, D=D, device=device, timer=timer, bandwidth=bandwidth, dynamic=True, fns=symbolic))
        progress(rows[-1])
    notes = ("NOT meaningful (CPU smoke run)" if args.smoke else
             f"CUDA-graph replay medians, 10 calls per graph; copy bandwidth {bandwidth / 1e12:.2f} TB/s; bf16, "
             "gate a strided split of the projection, group 128, kda forced")
    finish(NAME, rows, COLUMNS, notes, smoke=args.smoke, record=not args.no_record, results_dir=_HERE / "results",
           started=t0)
    return rows


if __name__ == "__main__":
    main()
