"""GPU benchmark of the ``gdn_spec_split`` rewrite (Qwen3-Next sizes); results in results/gdn_spec_split.md.

Two tables, CUDA-graph replay medians (``_timing``), T in {64, 256, 1024, 4096, 16384}
tokens, three quarters of them speculative (T=256: 192):

* the split alone, six gathers of ``mixed_qkv [T, 8192]`` bf16, ``g [1, T, 32]`` float32 and
  ``beta [1, T, 32]`` bf16: eager, stock ``torch.compile``, kda_inductor with
  its rewrites (``gdn_spec_split`` among them), and the floor (bytes read + written / copy bandwidth);
* the whole example layer (``examples/gdn_layers.py``, real dims): stock vs kda, the
  issue's "never slower" check.

Every compiled result is checked bit for bit against eager first. ``--smoke`` runs tiny
cases on CPU (checks only; timings not meaningful; nothing recorded).
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

NAME = "gdn_spec_split"
T_VALUES = (64, 256, 1024, 4096, 16384)
COLUMNS = (("T", "T", ","), ("eager_us", "eager us", ".1f"), ("stock_us", "stock us", ".1f"),
           ("kda_us", "kda us", ".1f"), ("floor_us", "floor us", ".1f"),
           ("stock_over_floor", "stock/floor", ".2f"), ("kda_over_floor", "kda/floor", ".2f"),
           ("layer_stock_us", "layer stock us", ".1f"), ("layer_kda_us", "layer kda us", ".1f"))


def split(qkv, g, beta, spec_idx, non_spec_idx):
    """The six gathers of a GDN layer's spec / non-spec split."""
    return (qkv.index_select(0, spec_idx), qkv.index_select(0, non_spec_idx),
            g.index_select(1, spec_idx), g.index_select(1, non_spec_idx),
            beta.index_select(1, spec_idx), beta.index_select(1, non_spec_idx))


def split_inputs(T: int, conv_dim: int, heads: int, device, g_dims: tuple[int, ...] | None = None):
    """Inputs of ``split``; ``g`` is ``[1, T, heads]`` (GDN) or ``[1, T, *g_dims]`` (KDA: heads, K)."""
    gen = torch.Generator().manual_seed(T)
    perm = torch.randperm(T, generator=gen)
    n_spec = 3 * T // 4
    return (torch.randn(T, conv_dim, generator=gen).to(torch.bfloat16).to(device),
            torch.randn(1, T, *(g_dims or (heads,)), generator=gen).to(device),
            torch.randn(1, T, heads, generator=gen).to(torch.bfloat16).to(device),
            perm[:n_spec].to(torch.int32).to(device), perm[n_spec:].to(torch.int32).to(device))


def bytes_moved(args) -> int:
    qkv, g, beta, s, ns = args
    rows = (s.numel() + ns.numel())
    per_row = qkv.shape[1] * qkv.element_size() + g[0, 0].numel() * g.element_size() + beta.shape[2] * beta.element_size()
    return 2 * rows * per_row + 2 * (s.numel() + ns.numel()) * s.element_size()


def check(label, got, want, *, exact: bool = True) -> None:
    """Bits for the gathers; for a whole layer, whose consumers Inductor fuses differently
    with and without the rewrite, each output within 2**-7 of its largest magnitude (one
    bf16 step there: out_proj sums thousands of products, so values near 0 are noise)."""
    from kda_inductor.testing import assert_close_in_range, assert_close_to_eager

    try:
        if exact:
            assert_close_to_eager(got, want, exact=True)
        else:
            assert_close_in_range(got, want)
    except AssertionError as e:
        raise SystemExit(f"{label}: compiled output differs from eager: {e}") from None


def run(T: int, *, smoke: bool, reps: int, bandwidth: float | None, layer_too: bool) -> dict:
    import gdn_layers as G

    torch._dynamo.reset()  # each T compiled for its own static shapes
    device = "cpu" if smoke else "cuda"
    cfg = G.GDNConfig.tiny() if smoke else G.GDNConfig()
    args = split_inputs(T, cfg.conv_dim, cfg.num_v_heads, device)
    stock = torch.compile(split, backend="inductor")
    kda = torch.compile(split, backend="kda_inductor")
    eager_out = split(*args)
    check(f"T={T} stock", stock(*args), eager_out)
    check(f"T={T} kda", kda(*args), eager_out)
    timer = (lambda f: perf_counter_median_us(f, reps)) if smoke else (
        lambda f: graph_replay_median_us(f, reps=reps, calls=10))
    row = {"T": T, "eager_us": timer(lambda: split(*args)), "stock_us": timer(lambda: stock(*args)),
           "kda_us": timer(lambda: kda(*args))}
    if bandwidth:
        row["floor_us"] = bytes_moved(args) / bandwidth * 1e6
        add_ratios(row, (("stock_over_floor", "stock_us", "floor_us"), ("kda_over_floor", "kda_us", "floor_us")))
    if layer_too:
        torch.manual_seed(0)
        layer = G.Qwen3NextGDN(cfg).to(device).eval()
        n_spec_reqs = max(1, 3 * T // 16)
        hidden, batch, states = G.make_inputs(layer, n_spec_reqs, max(1, T - 4 * n_spec_reqs), device=device)
        largs = (hidden, batch.spec_idx, batch.non_spec_idx, *states)
        with torch.no_grad():
            l_stock = torch.compile(layer, backend="inductor")
            l_kda = torch.compile(layer, backend="kda_inductor")
            # consumers fused differently may round differently: dtype tolerance, not bits
            check(f"T={T} layer", l_kda(*largs), l_stock(*largs), exact=False)
            # a layer call is 0.3-40 ms: one call per graph, few replays (the split's 20 x 10
            # calls per sample made T=16384 take minutes per number)
            ltimer = timer if smoke else (lambda f: graph_replay_median_us(f, reps=max(10, reps // 5), inner=2))
            row["layer_stock_us"] = ltimer(lambda: l_stock(*largs))
            row["layer_kda_us"] = ltimer(lambda: l_kda(*largs))
    return row


def report_row(T: int, s, *, conv_dim: int | None = None, g_dims=None, shape: str = "gdn") -> dict:
    """The six gathers of a GDN (or, with ``g_dims``, KDA) layer's split at ``T`` tokens, for
    ``benchmarks/report.py`` (``s``: its ``Settings``): eager, stock, kda and the floor."""
    import gdn_layers as G

    torch._dynamo.reset()
    cfg = G.GDNConfig.tiny() if s.smoke else G.GDNConfig()
    args = split_inputs(T, conv_dim or cfg.conv_dim, cfg.num_v_heads, s.device, g_dims=g_dims)
    stock, kda = torch.compile(split, backend="inductor"), s.compile_kda(split)
    want = split(*args)
    check(f"split T={T} stock", stock(*args), want)
    check(f"split T={T} kda", kda(*args), want)
    row = {"rewrite": "gdn_spec_split", "shape": shape, "T": T, "eager_us": s.timer(lambda: split(*args)),
           "stock_us": s.timer(lambda: stock(*args)), "kda_us": s.timer(lambda: kda(*args))}
    if s.bandwidth:
        row["floor_us"] = bytes_moved(args) / s.bandwidth * 1e6
    return s.ratios(row)


def report_jobs(s) -> list:
    """The report's rows: the GDN layer's split at each size; off smoke, the KDA layer's (g per
    key channel) at the model's step sizes."""
    jobs = [lambda T=T: report_row(T, s) for T in s.sizes]
    if not s.smoke:
        jobs += [lambda T=T: report_row(T, s, conv_dim=3 * 32 * 128, g_dims=(32, 128), shape="kda")
                 for T in s.all_steps.values()]
    return jobs


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--T", default=",".join(map(str, T_VALUES)))
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--skip-layer", action="store_true")
    p.add_argument("--no-record", action="store_true")
    p.add_argument("--smoke", action="store_true", help="tiny CPU run: checks only")
    args = p.parse_args(argv)
    if args.smoke:
        Ts, reps = [24], args.reps or 2
    else:
        if not torch.cuda.is_available():
            raise SystemExit("needs a CUDA GPU (use --smoke on CPU)")
        Ts, reps = [int(t) for t in args.T.split(",")], args.reps or 100
    # our pass runs on every graph: the graph caches off (the kernel caches may serve the kernels
    # of the second of two identical compiles, such as stock and kda on CPU in --smoke)
    import torch._functorch.config

    torch._inductor.config.fx_graph_cache = False
    torch._functorch.config.enable_autograd_cache = False
    import kda_inductor  # noqa: F401  (the backend, when not pip-installed)

    bandwidth = None if args.smoke else measure_copy_bandwidth("cuda")
    t0 = time.perf_counter()
    rows = []
    for T in Ts:
        rows.append(run(T, smoke=args.smoke, reps=reps, bandwidth=bandwidth, layer_too=not args.skip_layer))
        progress(rows[-1])
    notes = ("NOT meaningful (CPU smoke run)" if args.smoke else
             f"CUDA-graph replay medians, 10 calls per graph, per call; copy bandwidth "
             f"{bandwidth / 1e12:.2f} TB/s; three quarters of the tokens speculative")
    finish(NAME, rows, COLUMNS, notes, smoke=args.smoke, record=not args.no_record,
           results_dir=_HERE / "results", started=t0)
    return rows


if __name__ == "__main__":
    main()
