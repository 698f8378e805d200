"""GPU benchmark of the ``moe_grouped_experts`` rewrite: a MoE layer's experts as transformers'
``generate()`` runs them in its decoding steps (``batched_mm``: every selected expert's weights
gathered per (token, expert) pair, then a batched matrix-vector product), alone; a GPU run records
its table under benchmarks/results/ (``finish``).

    python benchmarks/bench_moe_grouped_experts.py --budget 300          # every case, a few minutes
    python benchmarks/bench_moe_grouped_experts.py --experts 512 --tokens 32
    python benchmarks/bench_moe_grouped_experts.py --smoke               # CPU, tiny dims: checks only

Per case (Qwen3-Next's experts: hidden 2048, moe intermediate 512, top-10; 512 experts as released
and 16 as ``benchmarks/hf_models.py``'s model keeps; 1 / 32 / 128 tokens), CUDA-graph replay medians
(``_timing``) of eager, stock ``torch.compile`` and kda_inductor with the rewrite forced (forced only
until this measures it) of transformers' own ``Qwen3NextExperts`` with ``batched_mm``, and the floor:
each used expert's weights, the tokens and the output read or written once at the copy bandwidth.
Each compiled result is checked against eager first (within bf16 rounding of a GEMM: cuBLAS' bmm and
torch's grouped GEMM tile K differently) and the kda compile must rewrite exactly one layer.
``--budget`` seconds stops it between cases.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE)]
from _timing import (  # noqa: E402
    add_ratios,
    finish,
    graph_replay_median_us,
    measure_copy_bandwidth,
    perf_counter_median_us,
    progress,
)

NAME = "moe_grouped_experts"
DIMS = (2048, 512, 10)  # Qwen3-Next: hidden, moe intermediate, experts a token
SMOKE_DIMS = (64, 32, 2)
EXPERTS, TOKENS = (512, 16), (1, 32, 128)
FORCED = {"kda": {"force": True}}
COLUMNS = (("E", "experts", ","), ("T", "tokens", ","), ("eager_us", "eager us", ".1f"),
           ("stock_us", "stock us", ".1f"), ("kda_us", "kda us", ".1f"), ("floor_us", "floor us", ".1f"),
           ("copy_mb", "gather MB", ".0f"), ("stock_over_kda", "stock/kda", ".2f"),
           ("kda_over_floor", "kda/floor", ".2f"))


def experts_layer(experts: int, dims, device):
    """transformers' ``Qwen3NextExperts`` with the ``batched_mm`` implementation (generate()'s decoding
    steps), bf16, random weights."""
    from transformers import Qwen3NextConfig
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextExperts

    hidden, inter, topk = dims
    cfg = Qwen3NextConfig(hidden_size=hidden, moe_intermediate_size=inter, num_experts=experts,
                          num_experts_per_tok=topk)
    cfg._experts_implementation = "batched_mm"
    layer = Qwen3NextExperts(cfg).to(device=device, dtype=torch.bfloat16).eval()
    g = torch.Generator(device=device).manual_seed(experts)
    for p in layer.parameters():
        p.data.normal_(0, hidden ** -0.5, generator=g)
    return layer


def inputs(tokens: int, experts: int, dims, device):
    """Hidden states ``[T, hidden]``, each token's top-k distinct expert ids and their weights."""
    hidden, _, topk = dims
    g = torch.Generator(device=device).manual_seed(tokens)
    x = torch.randn(tokens, hidden, generator=g, device=device).to(torch.bfloat16)
    ids = torch.rand(tokens, experts, generator=g, device=device).topk(topk, dim=-1).indices
    w = torch.softmax(torch.randn(tokens, topk, generator=g, device=device), -1).to(torch.bfloat16)
    return x, ids, w


def bytes_moved(layer, args) -> int:
    """The floor's bytes: each used expert's two projections read once, the tokens, the ids and the output."""
    x, ids, _ = args
    used = int(ids.unique().numel())
    per_expert = (layer.gate_up_proj[0].numel() + layer.down_proj[0].numel()) * 2
    return used * per_expert + 2 * x.nbytes + ids.nbytes


def copy_bytes(layer, args) -> int:
    """What the gathers write: every pair's two weight matrices."""
    pairs = args[1].numel()
    return pairs * (layer.gate_up_proj[0].numel() + layer.down_proj[0].numel()) * 2


def check(label: str, got, want) -> None:
    from kda_inductor.testing import assert_close_to_eager

    step = torch.finfo(want.dtype).eps * float(want.float().abs().max())
    try:
        assert_close_to_eager(got, want, rtol=0.02, atol=4 * step)
    except AssertionError as e:
        raise SystemExit(f"{label}: compiled output differs from eager: {e}") from None


def compiled_pair(label: str, layer, args):
    """``(stock, kda)`` compiled and checked; kda must have rewritten exactly one layer."""
    from kda_inductor import pass_manager

    torch._dynamo.reset()
    with torch.inference_mode():
        want = layer(*args)
        stock = torch.compile(layer, backend="inductor")
        kda = torch.compile(layer, backend="kda_inductor", options=FORCED)
        check(f"{label} stock", stock(*args), want)
        with pass_manager.observe() as records:
            got = kda(*args)
    done = pass_manager.total_matches(records)[NAME]
    if done != 1:
        raise SystemExit(f"{label}: kda rewrote {done} layers, expected 1")
    check(f"{label} kda", got, want)
    return stock, kda


def run(experts: int, tokens: int, *, smoke: bool, reps: int, bandwidth: float | None, s=None) -> dict:
    device = "cpu" if smoke else "cuda"
    dims = SMOKE_DIMS if smoke else DIMS
    layer = experts_layer(experts, dims, device)
    args = inputs(tokens, experts, dims, device)
    stock, kda = compiled_pair(f"E={experts} T={tokens}", layer, args)
    timer = (s.timer if s is not None else (lambda f: perf_counter_median_us(f, reps)) if smoke
             else (lambda f: graph_replay_median_us(f, reps=reps, inner=5, calls=5)))

    def timed(fn):
        with torch.inference_mode():
            return timer(lambda: fn(*args))

    row = {"E": experts, "T": tokens, "eager_us": timed(layer), "stock_us": timed(stock), "kda_us": timed(kda),
           "copy_mb": copy_bytes(layer, args) / 1e6}
    if bandwidth:
        row["floor_us"] = bytes_moved(layer, args) / bandwidth * 1e6
    return add_ratios(row, (("stock_over_kda", "stock_us", "kda_us"), ("kda_over_floor", "kda_us", "floor_us")))


def report_row(experts: int, tokens: int, s) -> dict:
    """One case for ``benchmarks/report.py`` (``s``: its ``Settings``), the rewrite forced."""
    row = run(experts, tokens, smoke=s.smoke, reps=s.reps, bandwidth=s.bandwidth, s=s)
    return {"rewrite": NAME, "shape": f"qwen3_next E={experts}", **{k: v for k, v in row.items() if k != "E"}}


def report_jobs(s) -> list:
    """The report's rows: Qwen3-Next's released experts at 1 and 32 tokens (smoke: tiny dims)."""
    if s.smoke:
        return [lambda: report_row(8, 3, s)]
    return [lambda t=t: report_row(512, t, s) for t in (1, 32)]


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--experts", default=",".join(map(str, EXPERTS)))
    p.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--budget", type=float, default=300, help="seconds; the cases after it are skipped")
    p.add_argument("--no-record", action="store_true")
    p.add_argument("--smoke", action="store_true", help="tiny CPU run: checks only")
    args = p.parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (use --smoke on CPU)")
    reps = args.reps or (2 if args.smoke else 50)
    import torch._functorch.config as functorch_config

    torch._inductor.config.fx_graph_cache = False  # our pass runs on every graph
    functorch_config.enable_autograd_cache = False
    import kda_inductor  # noqa: F401  (the backend, when not pip-installed)

    bandwidth = None if args.smoke else measure_copy_bandwidth("cuda")
    cases = [(8, 3), (8, 1)] if args.smoke else [(e, t) for e in map(int, args.experts.split(","))
                                                 for t in map(int, args.tokens.split(","))]
    t0, rows = time.perf_counter(), []
    for experts, tokens in cases:
        if time.perf_counter() - t0 > args.budget:
            rows.append({"E": experts, "T": tokens})
            print(f"E={experts} T={tokens}: skipped, --budget spent", flush=True)
            continue
        rows.append(run(experts, tokens, smoke=args.smoke, reps=reps, bandwidth=bandwidth))
        progress(rows[-1])
        if not args.smoke:
            torch.cuda.empty_cache()
    notes = ("NOT meaningful (CPU smoke run)" if args.smoke else
             f"CUDA-graph replay medians, 5 calls per graph, per call; kda with the rewrite forced; copy "
             f"bandwidth {bandwidth / 1e12:.2f} TB/s; transformers' Qwen3NextExperts, batched_mm, bf16")
    finish(NAME, rows, COLUMNS, notes, smoke=args.smoke, record=not args.no_record,
           results_dir=_HERE / "results", started=t0)
    return rows


if __name__ == "__main__":
    main()
