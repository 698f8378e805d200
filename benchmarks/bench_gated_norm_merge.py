"""GPU benchmark of the ``gated_norm_merge`` rewrite; results in results/gated_norm_merge.md.

Cases (``--case``, H=32, D=128, bf16, three quarters of the tokens speculative):

* ``merge``: the tail of a GDN layer (``examples/gdn_layers.py``): ``out = torch.empty(1, T, H,
  D)``, two ``index_copy_``, then the gated RMSNorm with silu (flash-linear-attention
  spelling), T in {64, 256, 1024, 4096, 16384};
* ``vllm``: vLLM's spelling: the merge into ``torch.empty``, copied into a zeros-initialized
  output padded by ``PAD`` tokens (``core_attn_out[:n] = merged.squeeze(0)``), the norm over
  all of it, T in {64, 256, 4096, 16384};
* ``kda4d``: KDA's sigmoid-gated ``o_norm`` on ``[1, T, H, D]`` directly (no merge), T in
  {64, 256, 4096, 16384} (above 4096 tokens the speed rule leaves it to Inductor).

CUDA-graph replay medians of eager, stock ``torch.compile``, kda_inductor (default options:
the speed rules apply), and the floor (bytes read and written once, at the measured copy
bandwidth). The kda result is checked against eager first (the GPU reduces in another
order than eager: at most 2 bf16 ulps) and its match count against the case's.
``--smoke`` runs tiny cases on CPU (checks only, rewrites forced; nothing recorded).
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
CASE_T = {"merge": T_VALUES, "vllm": (64, 256, 4096, 16384), "kda4d": (64, 256, 4096, 16384)}
PAD = 4
"""Padding tokens of the vllm case's output (as CUDA-graph capture sizes pad a batch)."""
COLUMNS = (("case", "case", ""), ("T", "T", ","), ("matched", "matched", "d"),
           ("eager_us", "eager us", ".1f"), ("stock_us", "stock us", ".1f"),
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


def vllm_tail(o_spec, o_non_spec, spec_idx, non_spec_idx, z, weight):
    """vLLM's GDN spelling: merge into torch.empty, copy into the padded zeros output, norm."""
    import gdn_layers as G

    T = spec_idx.shape[0] + non_spec_idx.shape[0]
    Tp, H, D = z.shape
    merged = torch.empty(1, T, H, D, dtype=o_spec.dtype, device=o_spec.device)
    merged.index_copy_(1, spec_idx, o_spec)
    merged.index_copy_(1, non_spec_idx, o_non_spec)
    core_attn_out = torch.zeros(Tp, H, D, dtype=o_spec.dtype, device=o_spec.device)
    core_attn_out[:T] = merged.squeeze(0)
    return G.gated_rmsnorm(core_attn_out.reshape(-1, D), z.reshape(-1, D), weight, 1e-6, "silu")


def kda_norm(x, z, weight):
    """KDA's o_norm on [1, T, H, D]: sigmoid gate, weight in float32, no reshape to rows."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.float()
    return (y * torch.sigmoid(z.float())).to(x.dtype)


def case_inputs(case: str, T: int, H: int, D: int, device):
    """(function, inputs, bytes that must move) for one case and size."""
    args = tail_inputs(T, H, D, device)
    o_s, o_ns, s, ns, z, w = args
    idx = (s.numel() + ns.numel()) * s.element_size()
    if case == "merge":
        return tail, args, bytes_moved(args)
    if case == "vllm":
        z = torch.cat([z, z[:PAD]]) if PAD else z
        out = z.numel() * z.element_size()
        return vllm_tail, (o_s, o_ns, s, ns, z, w), o_s.numel() * 2 + o_ns.numel() * 2 + idx + 2 * out
    if case == "kda4d":
        x = torch.cat([o_s, o_ns], dim=1)
        return kda_norm, (x, z.unsqueeze(0), w), 3 * x.numel() * x.element_size()
    raise SystemExit(f"unknown case {case!r}; cases: {sorted(CASE_T)}")


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


def expected_matches(case: str, T: int, H: int, D: int, forced: bool) -> int:
    """What the speed rules rewrite on CUDA (everything, when forced)."""
    from kda_inductor.patterns.gated_norm_merge import MERGE_FREE_MAX_VALUES

    return int(forced or case != "kda4d" or T * H * D <= MERGE_FREE_MAX_VALUES)


def run(T: int, *, smoke: bool, reps: int, bandwidth: float | None, H: int, D: int, case: str = "merge") -> dict:
    torch._dynamo.reset()  # each T compiled for its own static shapes
    device = "cpu" if smoke else "cuda"
    fn, args, moved = case_inputs(case, T, H, D, device)
    from kda_inductor.testing import compile_for_test, max_ulps

    stock = torch.compile(fn, backend="inductor")
    checked = compile_for_test(fn, force=smoke)  # on the GPU: what a user gets (speed rules on)
    want = fn(*args)
    got = checked(*args)
    matched = checked.matches[NAME]
    if matched != expected_matches(case, T, H, D, smoke):
        raise SystemExit(f"{case} T={T}: the rewrite matched {matched} times: {checked.matches}\n"
                         f"{[m for r in checked.records for m in r.misses[NAME]]}")
    kda = checked.compiled
    row = {"case": case, "T": T, "matched": matched, "max_ulps": max_ulps(got, want)}
    if row["max_ulps"] > (0 if smoke else 2):
        raise SystemExit(f"{case} T={T}: kda differs from eager by {row['max_ulps']} bf16 ulps")
    timer = (lambda f: perf_counter_median_us(f, reps)) if smoke else (
        lambda f: graph_replay_median_us(f, reps=reps, calls=10))
    row.update(eager_us=timer(lambda: fn(*args)), stock_us=timer(lambda: stock(*args)),
               kda_us=timer(lambda: kda(*args)))
    if bandwidth:
        row["floor_us"] = moved / bandwidth * 1e6
        add_ratios(row, (("stock_over_floor", "stock_us", "floor_us"), ("kda_over_floor", "kda_us", "floor_us")))
    return row


def _fla_peer(args):
    """flash-linear-attention's fused gated RMSNorm after the two ``index_copy_``, or None."""
    import fla_core

    if not fla_core.available() or not args[0].is_cuda:
        return None
    fla_core.fla()  # sets fla's tensor-cache switch
    try:
        from fla.modules.norm.fused_norm_gate import rms_norm_gated
    except ImportError:  # pragma: no cover - older layouts
        from fla.modules.fused_norm_gate import rms_norm_gated
    o_s, o_ns, si, nsi, z, w = args
    T, H, D = z.shape

    def peer():
        out = torch.empty(1, T, H, D, dtype=o_s.dtype, device=o_s.device)
        out.index_copy_(1, si, o_s)
        out.index_copy_(1, nsi, o_ns)
        return rms_norm_gated(out.view(-1, D), z.reshape(-1, D), w, None, activation="swish", eps=1e-6)

    return peer


def report_row(T: int, s) -> dict:
    """The merge + norm at ``T`` tokens for ``benchmarks/report.py``, with flash-linear-attention's
    fused gated norm as the peer where fla-core is installed."""
    H, D = (2, 16) if s.smoke else (32, 128)
    row = run(T, smoke=s.smoke, reps=s.reps, bandwidth=s.bandwidth, H=H, D=D)
    peer = _fla_peer(tail_inputs(T, H, D, s.device))
    row.update(rewrite="gated_norm_merge", shape=f"H={H} D={D}", peer_us=s.timer(peer) if peer is not None else None)
    return s.ratios(row)


def report_jobs(s) -> list:
    return [lambda T=T: report_row(T, s) for T in s.sizes]


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--T", default=None, help="token counts (default: each case's)")
    p.add_argument("--case", default="merge,vllm,kda4d", help=f"comma-separated, of {sorted(CASE_T)}")
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--no-record", action="store_true")
    p.add_argument("--smoke", action="store_true", help="tiny CPU run: checks only")
    args = p.parse_args(argv)
    cases = args.case.split(",")
    if args.smoke:
        plan, reps, H, D = [(c, 12) for c in cases], args.reps or 2, 2, 16
    else:
        if not torch.cuda.is_available():
            raise SystemExit("needs a CUDA GPU (use --smoke on CPU)")
        chosen = [int(t) for t in args.T.split(",")] if args.T else None
        plan = [(c, T) for c in cases for T in (chosen or CASE_T[c])]
        reps, H, D = args.reps or 100, 32, 128
    torch._inductor.config.force_disable_caches = True
    import kda_inductor  # noqa: F401  (the backend, when not pip-installed)

    bandwidth = None if args.smoke else measure_copy_bandwidth("cuda")
    t0 = time.perf_counter()
    rows = []
    for case, T in plan:
        rows.append(run(T, smoke=args.smoke, reps=reps, bandwidth=bandwidth, H=H, D=D, case=case))
        progress(rows[-1])
    notes = ("NOT meaningful (CPU smoke run)" if args.smoke else
             f"CUDA-graph replay medians, 10 calls per graph, per call; copy bandwidth "
             f"{bandwidth / 1e12:.2f} TB/s; H={H}, D={D}, bf16, three quarters of the tokens speculative; "
             f"vllm: output padded by {PAD} tokens; kda4d: no merge, sigmoid gate")
    finish(NAME, rows, COLUMNS, notes, smoke=args.smoke, record=not args.no_record,
           results_dir=_HERE / "results", started=t0)
    return rows


if __name__ == "__main__":
    main()
