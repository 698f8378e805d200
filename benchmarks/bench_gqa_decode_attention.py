"""GPU benchmark of the ``gqa_decode_attention`` rewrite: a decode step's attention as
transformers runs it under compile (a left-padded batch's bool mask ``[B, 1, 1, S]``, so
``repeat_kv`` copies K and V ``n_rep`` times), alone; a GPU run records its table under
benchmarks/results/ (``finish``).

    python benchmarks/bench_gqa_decode_attention.py --budget 360     # every case, ~5-7 min on an H100
    python benchmarks/bench_gqa_decode_attention.py --models qwen3_next --batches 128 --contexts 256
    python benchmarks/bench_gqa_decode_attention.py --smoke          # CPU, tiny dims: checks only

Per case (model dims: Qwen3-Next H 16 / Hkv 2 / D 256, Qwen3.5 H 16 / Hkv 4 / D 256; batches 32 /
128; contexts 256 / 4096 keys), CUDA-graph replay medians (``_timing``) of eager, stock
``torch.compile``, kda_inductor with the rewrite forced (its fold calling torch's sdpa), the same
with the fold calling our decode kernel (``kda+kernel``: ``KERNEL_MEASURED`` in the pattern file),
the kernel alone on the folded shapes (``op``), the floor (q, the un-repeated K / V, the mask and the output read or written
once, at the copy bandwidth) and the bytes the repeat moves (``2 x B x H x S x D`` elements
written, then read by the attention). Each compiled result is checked against eager first
(bf16: within two bf16 steps of the output's scale; the fold runs the fused kernel on
``n_rep`` query rows per kv head, which tiles the rows differently) and the kda compile must
fold exactly one attention. ``--budget`` seconds stops it between cases.
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

NAME = "gqa_decode_attention"
MODELS = {"qwen3_next": (16, 2, 256), "qwen3_5": (16, 4, 256)}  # (H, Hkv, D) of the full-attention layers
SMOKE_DIMS = (4, 2, 16)
BATCHES, CONTEXTS = (32, 128), (256, 4096)
FORCED = {"kda": {"force": True}}
COLUMNS = (("model", "model", ""), ("B", "B", ","), ("S", "S", ","), ("eager_us", "eager us", ".1f"),
           ("stock_us", "stock us", ".1f"), ("kda_us", "kda us", ".1f"), ("kda_kernel_us", "kda+kernel us", ".1f"),
           ("op_us", "op us", ".1f"), ("op_b16_us", "op 16x4 us", ".1f"), ("op_b64w8_us", "op 64x8 us", ".1f"),
           ("floor_us", "floor us", ".1f"),
           ("repeat_mb", "repeat MB", ".0f"), ("stock_over_kda", "stock/kda", ".2f"),
           ("kda_over_floor", "kda/floor", ".2f"), ("kernel_over_kda", "kda+kernel/kda", ".2f"),
           ("op_over_floor", "op/floor", ".2f"))


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """transformers' ``repeat_kv``: ``[B, Hkv, S, D]`` -> ``[B, Hkv * n_rep, S, D]``."""
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n_rep, s, d).reshape(b, h * n_rep, s, d)


def attention(query, key, value, mask):
    """transformers' sdpa integration with a mask: repeat, attend, ``[B, 1, H, D]`` out."""
    n_rep = query.shape[1] // key.shape[1]
    out = F.scaled_dot_product_attention(query, repeat_kv(key, n_rep), repeat_kv(value, n_rep), attn_mask=mask,
                                         scale=query.shape[-1] ** -0.5)
    return out.transpose(1, 2).contiguous()


def inputs(batch: int, keys: int, dims: tuple[int, int, int], device, dtype=torch.bfloat16):
    """Query ``[B, H, 1, D]`` (a transposed projection), K / V ``[B, Hkv, S, D]`` and a
    left-padded batch's bool mask ``[B, 1, 1, S]`` (every other sequence a quarter shorter)."""
    h, hkv, d = dims
    g = torch.Generator(device=device).manual_seed(batch * keys)  # on the device: GBs at B 128, S 4096
    q = torch.randn(batch, 1, h, d, generator=g, device=device).to(dtype).transpose(1, 2)
    k, v = (torch.randn(batch, hkv, keys, d, generator=g, device=device).to(dtype) for _ in range(2))
    mask = torch.ones(batch, 1, 1, keys, dtype=torch.bool)
    mask[1::2, ..., : keys // 4] = False
    return q, k, v, mask.to(device)


def bytes_moved(args) -> int:
    """What the attention must read and write once: q, the un-repeated K / V, the mask, the output."""
    q, k, v, mask = args
    return 2 * q.nbytes + k.nbytes + v.nbytes + mask.nbytes


def repeated_bytes(args) -> int:
    """The repeat's write of K and V at H heads (``2 x B x H x S x D`` elements)."""
    q, k, _, _ = args
    return 2 * q.shape[0] * q.shape[1] * k.shape[2] * k.shape[3] * k.element_size()


def check(label: str, got, want) -> None:
    """Within two bf16 steps of the output's largest magnitude (the fold's other tiling of the
    rows; float32 on CPU: the same bound at float32's step)."""
    from kda_inductor.testing import assert_close_to_eager

    step = torch.finfo(want.dtype).eps * float(want.float().abs().max())
    try:
        assert_close_to_eager(got, want, rtol=0.02, atol=2 * step)
    except AssertionError as e:
        raise SystemExit(f"{label}: compiled output differs from eager: {e}") from None


def compiled_pair(label: str, args):
    """``(stock, kda, kda with our decode kernel)`` compiled and checked; each kda compile must
    have folded exactly one attention."""
    from kda_inductor.lowerings.gqa_decode_attention import refusal

    torch._dynamo.reset()  # each case compiled for its own static shapes
    want = attention(*args)
    stock = torch.compile(attention, backend="inductor")
    check(f"{label} stock", stock(*args), want)
    kda = _kda(label, args, want, kernel=False)
    takes = args[0].device.type == "cpu" or refusal(args[0], args[2]) is None  # CPU: the op is sdpa (smoke)
    kernel = _kda(label, args, want, kernel=True) if takes else None
    return stock, kda, kernel


def _kda(label: str, args, want, *, kernel: bool):
    """kda_inductor forced, its fold calling torch's sdpa or (``kernel``) our decode kernel."""
    from kda_inductor import pass_manager
    from kda_inductor.patterns import gqa_decode_attention as pattern

    flag, pattern.KERNEL_MEASURED = pattern.KERNEL_MEASURED, {"cuda": kernel, "cpu": kernel}
    try:
        fn = torch.compile(attention, backend="kda_inductor", options=FORCED, dynamic=False)
        torch._dynamo.reset()
        with pass_manager.observe() as records:
            got = fn(*args)
    finally:
        pattern.KERNEL_MEASURED = flag
    folded = pass_manager.total_matches(records)[NAME]
    if folded != 1:
        raise SystemExit(f"{label}: kda folded {folded} attentions, expected 1")
    check(f"{label} kda{'+kernel' if kernel else ''}", got, want)
    return fn


OP_CONFIGS = {"op_b16_us": (16, 4), "op_b64w8_us": (64, 8)}
"""Other launches of the kernel timed beside the default (keys a step, warps): the sweep."""


def op_call(args, config=None):
    """Our decode kernel called directly on the folded shapes (``[B, Hkv, n_rep, D]`` queries): the
    op, or with ``config`` (keys a step, warps) its launcher with that launch."""
    from kda_inductor.lowerings.gqa_decode_attention import attention_triton

    q, k, v, mask = args
    qf = q.unflatten(1, (k.shape[1], -1)).squeeze(3)
    if config is None:
        return lambda: torch.ops.kda.gqa_decode_attention(qf, k, v, mask, q.shape[-1] ** -0.5)
    out = qf.new_empty((*qf.shape[:3], v.shape[3]))
    return lambda: attention_triton(qf, k, v, mask, None, out, block_s=config[0], num_warps=config[1])


def run(model: str, batch: int, keys: int, *, smoke: bool, reps: int, bandwidth: float | None, s=None) -> dict:
    device = "cpu" if smoke else "cuda"
    dims = SMOKE_DIMS if smoke else MODELS[model]
    args = inputs(batch, keys, dims, device, dtype=torch.float32 if smoke else torch.bfloat16)
    label = f"{model} B={batch} S={keys}"
    stock, kda, kernel = compiled_pair(label, args)
    timer = (s.timer if s is not None else (lambda f: perf_counter_median_us(f, reps)) if smoke
             else (lambda f: graph_replay_median_us(f, reps=reps, inner=5, calls=5)))
    row = {"model": model, "B": batch, "S": keys, "eager_us": timer(lambda: attention(*args)),
           "stock_us": timer(lambda: stock(*args)), "kda_us": timer(lambda: kda(*args)),
           "repeat_mb": repeated_bytes(args) / 1e6}
    if kernel is not None:
        row["kda_kernel_us"] = timer(lambda: kernel(*args))
        row["op_us"] = timer(op_call(args))
        if not smoke:
            row.update({name: timer(op_call(args, config)) for name, config in OP_CONFIGS.items()})
    if bandwidth:
        row["floor_us"] = bytes_moved(args) / bandwidth * 1e6
    return add_ratios(row, (("stock_over_kda", "stock_us", "kda_us"), ("kda_over_floor", "kda_us", "floor_us"),
                            ("kernel_over_kda", "kda_kernel_us", "kda_us"), ("op_over_floor", "op_us", "floor_us")))


def report_row(model: str, batch: int, keys: int, s) -> dict:
    """One case for ``benchmarks/report.py`` (``s``: its ``Settings``), the rewrite forced."""
    row = run(model, batch, keys, smoke=s.smoke, reps=s.reps, bandwidth=s.bandwidth, s=s)
    return {"rewrite": NAME, "shape": model, "T": batch, **{k: v for k, v in row.items() if k not in ("model", "B")}}


def report_jobs(s) -> list:
    """The report's rows: Qwen3-Next's decode attention at 32 and 128 sequences, 256 keys
    (smoke: tiny dims, 2 sequences, 16 keys)."""
    if s.smoke:
        return [lambda: report_row("qwen3_next", 2, 16, s)]
    return [lambda B=B: report_row("qwen3_next", B, 256, s) for B in BATCHES]


def cases(args) -> list[tuple[str, int, int]]:
    if args.smoke:
        return [("qwen3_next", 2, 16), ("qwen3_5", 3, 9)]
    # the short contexts first (the finding's case: 257 keys), so that a spent budget skips the long ones
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
    import torch._functorch.config as functorch_config  # (a plain `import torch.x` would make torch local here)

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
