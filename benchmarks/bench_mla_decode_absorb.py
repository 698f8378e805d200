"""GPU benchmark of the ``mla_decode_absorb`` rewrite: a decode step's MLA attention as
transformers' Kimi Linear (and DeepSeek-V3 / V3.2) runs it under compile (``expand_kv``:
``kv_b_proj`` over every cached token's latents, the key built by ``new_empty`` + two ``copy_``,
then sdpa with a left-padded batch's bool mask ``[B, 1, 1, S]``), alone; a GPU run records its
table under benchmarks/results/ (``finish``).

    python benchmarks/bench_mla_decode_absorb.py --budget 360     # every case
    python benchmarks/bench_mla_decode_absorb.py --batches 128 --contexts 257
    python benchmarks/bench_mla_decode_absorb.py --smoke          # CPU, tiny dims: checks only

Per case (Kimi Linear's MLA dims from transformers' ``KimiLinearConfig`` defaults: 32 heads,
kv_lora_rank 512, qk_nope 128, qk_rope 64, v_head 128; batches 32 / 128; contexts 257 / 4097 keys (a cache of
256 / 4,096 and the new token: odd, as in a decode step), CUDA-graph replay medians (``_timing``) of eager, stock ``torch.compile``,
kda_inductor with the rewrite forced (weight absorption in plain torch ops), the floor (the
query, the latents and the rope keys, the mask, ``kv_b_proj``'s weight and the output read or
written once, at the copy bandwidth) and the bytes the expansion writes (K and V at every head:
``B x S x H x (dn + dr + dv)`` elements). Each compiled result is checked against eager first
(bf16: within four bf16 steps of the output's scale: absorption sums in another order) and the
kda compile must rewrite exactly one attention. ``--budget`` seconds stops it between cases.
This benchmark decides ``MEASURED`` in ``kda_inductor/patterns/mla_decode_absorb.py``.
"""

from __future__ import annotations

import argparse
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
    measure_copy_bandwidth,
    perf_counter_median_us,
    progress,
)

NAME = "mla_decode_absorb"
MODELS = {"kimi_linear": (32, 512, 128, 64, 128)}  # (H, r, dn, dr, dv): KimiLinearConfig's defaults
SMOKE_DIMS = (4, 16, 8, 4, 12)
BATCHES, CONTEXTS = (32, 128), (257, 4097)  # a decode step's keys: the cache + the new token
FORCED = {"kda": {"force": True}}
COLUMNS = (("model", "model", ""), ("B", "B", ","), ("S", "S", ","), ("eager_us", "eager us", ".1f"),
           ("stock_us", "stock us", ".1f"), ("kda_us", "kda us", ".1f"), ("floor_us", "floor us", ".1f"),
           ("expanded_mb", "expanded MB", ".0f"), ("stock_over_kda", "stock/kda", ".2f"),
           ("kda_over_floor", "kda/floor", ".2f"))


def attention(query, latents, k_rot, weight, mask):
    """transformers 5.25's ``expand_kv`` and its sdpa call: ``latents [B, 1, S, r]`` through
    ``kv_b_proj`` (``weight [H * (dn + dv), r]``), the key built in a ``new_empty``, ``[B, 1, H, dv]`` out."""
    b, h, _, d = query.shape
    s, dr = latents.shape[2], k_rot.shape[-1]
    dn = d - dr
    kv = F.linear(latents, weight).view(b, s, h, -1).transpose(1, 2)
    k_nope, value = torch.split(kv, [dn, kv.shape[-1] - dn], dim=-1)
    key = kv.new_empty(b, h, s, d)
    key[..., :dn].copy_(k_nope)
    key[..., dn:].copy_(k_rot.expand(-1, h, -1, -1))
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=d ** -0.5)
    return out.transpose(1, 2).contiguous()


def inputs(batch: int, keys: int, dims: tuple[int, ...], device, dtype=torch.bfloat16):
    """Query ``[B, H, 1, dn + dr]`` (a transposed projection), the cached latents ``[B, 1, S, r]``
    and rope keys ``[B, 1, S, dr]``, ``kv_b_proj``'s weight (scaled as a trained one: outputs of
    order one) and a left-padded batch's bool mask ``[B, 1, 1, S]`` (every other sequence a
    quarter shorter)."""
    h, r, dn, dr, dv = dims
    g = torch.Generator(device=device).manual_seed(batch * keys)
    q = torch.randn(batch, 1, h, dn + dr, generator=g, device=device).to(dtype).transpose(1, 2)
    c = torch.randn(batch, 1, keys, r, generator=g, device=device).to(dtype)
    rot = torch.randn(batch, 1, keys, dr, generator=g, device=device).to(dtype)
    w = (torch.randn(h * (dn + dv), r, generator=g, device=device) * r ** -0.5).to(dtype)
    mask = torch.ones(batch, 1, 1, keys, dtype=torch.bool)
    mask[1::2, ..., : keys // 4] = False
    return q, c, rot, w, mask.to(device)


def bytes_moved(args) -> int:
    """What the absorbed attention must read and write once: q, the latents, the rope keys, the
    weight, the mask and the output (``B x H x dv``)."""
    q, c, rot, w, mask = args
    dv = w.shape[0] // q.shape[1] - (q.shape[-1] - rot.shape[-1])
    return q.nbytes + c.nbytes + rot.nbytes + w.nbytes + mask.nbytes + q.shape[0] * q.shape[1] * dv * q.element_size()


def expanded_bytes(args) -> int:
    """The expansion's writes: K (``dn + dr``) and V (``dv``) at every head for every cached token."""
    q, c, rot, w, _ = args
    h = q.shape[1]
    return q.shape[0] * c.shape[2] * (w.shape[0] + h * rot.shape[-1]) * q.element_size()


def check(label: str, got, want) -> None:
    """Within four steps of the dtype at the output's largest magnitude (another summation order)."""
    from kda_inductor.testing import assert_close_to_eager

    step = torch.finfo(want.dtype).eps * float(want.float().abs().max())
    try:
        assert_close_to_eager(got, want, rtol=0.02, atol=4 * step)
    except AssertionError as e:
        raise SystemExit(f"{label}: compiled output differs from eager: {e}") from None


def compiled_pair(label: str, args):
    """``(stock, kda)`` compiled and checked; the kda compile must rewrite exactly one attention."""
    from kda_inductor import pass_manager

    torch._dynamo.reset()  # each case compiled for its own static shapes
    want = attention(*args)
    stock = torch.compile(attention, backend="inductor")
    check(f"{label} stock", stock(*args), want)
    kda = torch.compile(attention, backend="kda_inductor", options=FORCED, dynamic=False)
    torch._dynamo.reset()
    with pass_manager.observe() as records:
        got = kda(*args)
    absorbed = pass_manager.total_matches(records)[NAME]
    if absorbed != 1:
        raise SystemExit(f"{label}: kda absorbed {absorbed} attentions, expected 1")
    check(f"{label} kda", got, want)
    return stock, kda


def run(model: str, batch: int, keys: int, *, smoke: bool, reps: int, bandwidth: float | None, s=None) -> dict:
    device = "cpu" if smoke else "cuda"
    dims = SMOKE_DIMS if smoke else MODELS[model]
    args = inputs(batch, keys, dims, device, dtype=torch.float32 if smoke else torch.bfloat16)
    stock, kda = compiled_pair(f"{model} B={batch} S={keys}", args)
    timer = (s.timer if s is not None else (lambda f: perf_counter_median_us(f, reps)) if smoke
             else (lambda f: graph_replay_median_us(f, reps=reps, inner=5, calls=5)))
    row = {"model": model, "B": batch, "S": keys, "eager_us": timer(lambda: attention(*args)),
           "stock_us": timer(lambda: stock(*args)), "kda_us": timer(lambda: kda(*args)),
           "expanded_mb": expanded_bytes(args) / 1e6}
    if bandwidth:
        row["floor_us"] = bytes_moved(args) / bandwidth * 1e6
    return add_ratios(row, (("stock_over_kda", "stock_us", "kda_us"), ("kda_over_floor", "kda_us", "floor_us")))


def report_row(model: str, batch: int, keys: int, s) -> dict:
    """One case for ``benchmarks/report.py`` (``s``: its ``Settings``), the rewrite forced."""
    row = run(model, batch, keys, smoke=s.smoke, reps=s.reps, bandwidth=s.bandwidth, s=s)
    return {"rewrite": NAME, "shape": model, "T": batch, **{k: v for k, v in row.items() if k not in ("model", "B")}}


def report_jobs(s) -> list:
    """The report's rows: Kimi Linear's MLA decode attention at 32 and 128 sequences, 256 cached
    tokens (smoke: tiny dims, 2 sequences, 16 tokens)."""
    if s.smoke:
        return [lambda: report_row("kimi_linear", 2, 16, s)]
    return [lambda B=B: report_row("kimi_linear", B, 256, s) for B in BATCHES]


def cases(args) -> list[tuple[str, int, int]]:
    if args.smoke:
        return [("kimi_linear", 2, 16), ("kimi_linear", 3, 9)]
    return [(m, b, c) for c in map(int, args.contexts.split(",")) for m in args.models.split(",")
            for b in map(int, args.batches.split(","))]


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--batches", default=",".join(map(str, BATCHES)))
    p.add_argument("--contexts", default=",".join(map(str, CONTEXTS)))
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--budget", type=float, default=360, help="seconds; the cases after it are skipped")
    p.add_argument("--no-record", action="store_true")
    p.add_argument("--smoke", action="store_true", help="tiny CPU run: checks only")
    args = p.parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (use --smoke on CPU)")
    reps = args.reps or (2 if args.smoke else 50)
    # our pass runs on every graph: the graph caches off (stock and kda compile the same graph)
    import torch._functorch.config as functorch_config

    torch._inductor.config.fx_graph_cache = False
    functorch_config.enable_autograd_cache = False
    import kda_inductor  # noqa: F401  (the backend, when not pip-installed)

    bandwidth = None if args.smoke else measure_copy_bandwidth("cuda")
    t0 = time.perf_counter()
    rows = []
    for model, batch, keys in cases(args):
        if time.perf_counter() - t0 > args.budget:
            rows.append({"model": model, "B": batch, "S": keys})
            print(f"{model} B={batch} S={keys}: skipped, --budget spent", flush=True)
            continue
        rows.append(run(model, batch, keys, smoke=args.smoke, reps=reps, bandwidth=bandwidth))
        progress(rows[-1])
        if not args.smoke:
            torch.cuda.empty_cache()
    notes = ("NOT meaningful (CPU smoke run)" if args.smoke else
             f"CUDA-graph replay medians, 5 calls per graph, per call; kda with the rewrite forced; copy "
             f"bandwidth {bandwidth / 1e12:.2f} TB/s; bool mask [B, 1, 1, S] of a left-padded batch")
    finish(NAME, rows, COLUMNS, notes, smoke=args.smoke, record=not args.no_record,
           results_dir=_HERE / "results", started=t0)
    return rows


if __name__ == "__main__":
    main()
