"""``gdn_chunk`` on a GPU: the chunked gated delta rule forward over a prefill (one sequence of T
tokens, no initial state, the final state returned) at Qwen3-Next's dims (16 q / k heads, 32 v
heads, K = V = 128, bf16 q / k / v / beta, float32 g), as our op and its peers run it.

Variants, each checked against a float32 reference (transformers' ``torch_chunk_gated_delta_rule``
on float32 copies of the inputs, eager; relative norm error ``|o - ref| / |ref|`` of the output,
``err``, and of the final state, ``state err``), then timed:

* ``kda``: ``kda::gdn_chunk`` as it runs (:data:`~kda_inductor.lowerings.gdn_chunk.DEFAULT`, which is
  ``FAST``: three launches, bf16 products and intermediates as fla's; l2norm of q / k and the scale
  inside).
* ``kda3``: the same op with ``FAST3`` (``LaunchConfig.v3``: four launches, ``wu2`` split in two as
  fla's ``kkt_solve`` / ``recompute_w_u``), side by side until it is timed and made the default.
* ``kda2``: the same op with the four float32 launches (``LaunchConfig()``, the default before
  2026-12-05), side by side.
* ``fla``: flash-linear-attention's ``chunk_gated_delta_rule`` (fla-core, where importable; called
  with ``use_qk_l2norm_in_kernel=True``, GVA heads as they are).
* ``stock``: stock ``torch.compile`` of transformers' ``torch_chunk_gated_delta_rule`` (its torch
  core, never the fla dispatch around it), l2norm in the function as the layer asks. Its chunk loop
  is unrolled in the graph (T / 64 iterations): compiles take minutes past a few thousand tokens,
  so it runs only up to ``--stock-max-t`` (default 8192). ``eager``: the same uncompiled.

Times are CUDA-graph replay medians (one call per graph; ``_timing.graph_replay_median_us``), the
inputs large enough (>= 25 MB at T = 256 ... 1.6 GB at 65536) that a call streams from HBM.

    python benchmarks/bench_gdn_chunk.py --quick --budget 200     # T = 4096 and 16384 (~2-3 min on an H200)
    python benchmarks/bench_gdn_chunk.py --budget 500             # T = 256 ... 65536
    python benchmarks/bench_gdn_chunk.py --sweep --T 16384        # kda's launch configs (LaunchConfig)
    python benchmarks/bench_gdn_chunk.py --sweep --T 4096,16384 --configs "FAST,FAST inv doubling"   # those rows
    python benchmarks/bench_gdn_chunk.py --sweep --T 4096 --configs "FAST,FAST4" --profile   # + their kernels, fla's
    python benchmarks/gdn_chunk_registers.py                      # no GPU: each config's registers for sm_90
    python benchmarks/bench_gdn_chunk.py --profile --T 4096       # + each kernel's time (torch.profiler)
    python benchmarks/bench_gdn_chunk.py --smoke                  # CPU, tiny: the code paths only
    python benchmarks/bench_gdn_chunk.py --kda --quick --budget 240   # KDA at Kimi Linear's dims (below)
    python benchmarks/bench_gdn_chunk.py --kda --sweep --T 16384 --budget 200   # KDA's launch configs

``--kda``: a decay per key channel (``g [1, T, Hv, K]``, Kimi Linear's KDA) at Kimi Linear's dims
(``linear_num_heads`` 32 q / k / v heads, ``linear_head_dim`` K = V = 128; ``g = -exp(A_log)
softplus(x + dt_bias)`` per channel with the model's initial ``A_log`` / ``dt_bias`` ranges):
``kda`` (the op, :data:`~kda_inductor.lowerings.gdn_chunk.KDA`'s launches), ``kda fp32`` (the same
launches with tf32 products and float32 intermediates), ``fla`` (fla-core's ``chunk_kda``, where
importable), ``stock`` (stock ``torch.compile`` of transformers' ``chunk_kimi_delta_attention``, its
torch reference: the speed rule of rule 3 for Kimi Linear) and ``eager`` (the same uncompiled), both up
to ``--stock-max-t`` (its decay mask is ``[T / 64, 64, 64, K]`` floats a head), all against the
op's float32 token loop (on the GPU: seconds at T = 16,384). Recorded as ``gdn_chunk_kda.{md,json}``.

``--profile`` (on by default with ``--quick``): after the timings, each variant's kernels by name
from ``torch.profiler`` (3 calls after 2 warm-ups, eager launches, so a kernel's time is its own;
their sum can exceed the graph-replay time by the gaps between launches), our four launches and
fla's kernels side by side.

No new case starts after ``--budget`` seconds; the rows done are recorded (``benchmarks/results/
gdn_chunk.{md,json}``, and ``$OUT/bench_gdn_chunk.json`` when ``OUT`` is set).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, NamedTuple

import torch

if "--smoke" in sys.argv and not torch.cuda.is_available():  # our kernels on CPU tensors (before triton)
    os.environ.setdefault("TRITON_INTERPRET", "1")
_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE), str(_HERE.parent), str(_HERE.parent / "examples")]
from _timing import (  # noqa: E402
    append_markdown,
    environment_info,
    graph_replay_median_us,
    kernel_profile,
    markdown_table,
    perf_counter_median_us,
    print_table,
    progress,
    write_json,
    write_out_json,
)

from kda_inductor.lowerings import gdn_chunk as L  # noqa: E402  (registers kda::gdn_chunk)
from gdn_chunk_configs import kda_sweep_configs, selected_configs, sweep_configs  # noqa: E402,F401  (the sweep's)

NAME = "gdn_chunk"


class Dims(NamedTuple):
    k_heads: int
    v_heads: int
    k_dim: int
    v_dim: int


QWEN3_NEXT = Dims(16, 32, 128, 128)
SMOKE = Dims(1, 2, 16, 16)
KIMI_LINEAR = Dims(32, 32, 128, 128)
"""Kimi-Linear-48B-A3B's KDA layers (``linear_num_heads`` 32, ``linear_head_dim`` 128)."""
SMOKE_KDA = Dims(2, 2, 16, 16)
"""``--kda --smoke``: as many q / k heads as v heads, as Kimi's layers (transformers' KDA core repeats none)."""
KDA_MODE = False
"""``--kda``: a decay per key channel at :data:`KIMI_LINEAR` (the ``kda_*`` functions)."""
TOKENS = (256, 1024, 4096, 16384, 65536)
QUICK = (4096, 16384)


def make_inputs(d: Dims, T: int, device, seed: int = 0) -> dict:
    """A prefill's tensors as the layer makes them: bf16 q / k / v, ``g = logsigmoid`` (log decay
    < 0), bf16 ``beta`` a sigmoid."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, device=device, generator=gen)

    return dict(q=rnd(1, T, d.k_heads, d.k_dim).bfloat16(), k=rnd(1, T, d.k_heads, d.k_dim).bfloat16(),
                v=rnd(1, T, d.v_heads, d.v_dim).bfloat16(), g=torch.nn.functional.logsigmoid(rnd(1, T, d.v_heads)),
                beta=torch.sigmoid(rnd(1, T, d.v_heads)).bfloat16())


def make_kda_inputs(d: Dims, T: int, device, seed: int = 0) -> dict:
    """:func:`make_inputs` with a decay per key channel as Kimi's gate makes it: ``-exp(A_log)
    softplus(x + dt_bias)``, ``A_log = log U(1, 16)`` a head, ``dt_bias`` the inverse softplus of
    ``U(1e-3, 1e-1)`` a channel (the model's initial ranges), ``x`` a unit normal."""
    x = make_inputs(d, T, device, seed)
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    a = torch.empty(d.v_heads, 1, device=device).uniform_(1, 16, generator=gen)
    dt = torch.empty(d.v_heads, d.k_dim, device=device).uniform_(1e-3, 1e-1, generator=gen)
    bias = dt + torch.log(-torch.expm1(-dt))
    x["g"] = -a * torch.nn.functional.softplus(torch.randn(1, T, d.v_heads, d.k_dim, device=device,
                                                           generator=gen) + bias)
    return x


# --------------------------------------------------------------------------- the variants


def transformers_chunk() -> Callable | None:
    """transformers' torch core ``torch_chunk_gated_delta_rule`` (qwen3_next), unwrapped from the
    hub / fla dispatch (5.25 wraps it in a module whose ``forward`` calls the wrapper ``func``)."""
    import inspect

    try:
        from transformers.models.qwen3_next import modeling_qwen3_next as mq
    except ImportError:
        return None
    fn = getattr(mq, "torch_chunk_gated_delta_rule", None)
    if isinstance(fn, torch.nn.Module):
        fn = inspect.getclosurevars(type(fn).forward).nonlocals.get("func", fn)
    return getattr(fn, "__wrapped__", fn)


def _hf_call(fn):
    """transformers' core as its layer calls it: q / k repeated to v's heads first (5.17's core takes
    as many q / k heads as v heads; 5.25's repeats inside, a no-op after this). Seen on an H100,
    2026-12-05: without it, 5.17's core failed on Qwen3-Next's 16 / 32 heads."""
    def call(x):
        group = x["v"].shape[2] // x["q"].shape[2]
        q, k = (x["q"], x["k"]) if group == 1 else (x["q"].repeat_interleave(group, 2),
                                                       x["k"].repeat_interleave(group, 2))
        return fn(q, k, x["v"], x["g"], x["beta"], initial_state=None, output_final_state=True,
                  use_qk_l2norm_in_kernel=True)
    return call


def kda(x, config=None):
    """The op (on CPU tensors, the smoke run: its Triton kernels under the interpreter, not the op's
    CPU loop, which is the reference)."""
    if config is not None or x["q"].device.type == "cpu":
        return L.chunk_triton(x["q"], x["k"], x["v"], x["g"], x["beta"], None, None, True, config=config)
    return torch.ops.kda.gdn_chunk(x["q"], x["k"], x["v"], x["g"], x["beta"], None, None, True)


def fla_chunk() -> Callable | None:
    try:
        import fla_core

        if not fla_core.available():
            return None
        fn = fla_core.fla().gdn_chunk
    except Exception:  # noqa: BLE001 - not installed, or its import fails here
        traceback.print_exc()
        return None
    return lambda x: fn(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=None, output_final_state=True,
                        use_qk_l2norm_in_kernel=True)


def kda3(x):
    """The op with :data:`~kda_inductor.lowerings.gdn_chunk.FAST3` (v3: the inverse and ``w, u`` in
    two launches, 64-row products with the stored inverse, as fla's ``kkt_solve`` /
    ``recompute_w_u``; v2's scan and output)."""
    return kda(x, L.FAST3)


def kda3_fused(x):
    """``FAST3`` with ``solve3`` and ``wu3`` in one launch (``fuse_wu``, 8 warps): the profile only."""
    return kda(x, L.FAST3._replace(fuse_wu=True, warps=8))


def kda_inv(x):
    """:data:`~kda_inductor.lowerings.gdn_chunk.FAST` with ``wu2``'s inverse by doubling blocks (float32
    products, ``LaunchConfig.wu_inverse="doubling"``): the profile only (``wu2_kernel``'s time against
    ``kda``'s)."""
    return kda(x, L.FAST._replace(wu_inverse="doubling"))


def kda2(x):
    """The op with the four float32 launches (``LaunchConfig()``), the default before :data:`FAST`."""
    return kda(x, L.LaunchConfig())


def kda_fla() -> Callable | None:
    """fla-core's ``chunk_kda`` (fla's own chunked KDA kernels), None where not importable."""
    try:
        import fla_core

        if not fla_core.available():
            return None
        fn = fla_core.fla().kda_chunk
    except Exception:  # noqa: BLE001 - not installed, or its import fails here
        traceback.print_exc()
        return None
    return lambda x: fn(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=None, output_final_state=True,
                        use_qk_l2norm_in_kernel=True)


def kda_transformers() -> Callable | None:
    """transformers' torch reference of KDA (``chunk_kimi_delta_attention``), unwrapped from the hub /
    fla dispatch as :func:`transformers_chunk` does."""
    import inspect

    try:
        from transformers.models.kimi_linear import modeling_kimi_linear as mk
    except ImportError:
        return None
    fn = getattr(mk, "chunk_kimi_delta_attention", None)
    if isinstance(fn, torch.nn.Module):
        fn = inspect.getclosurevars(type(fn).forward).nonlocals.get("func", fn)
    fn = getattr(fn, "__wrapped__", fn)
    return None if fn is None else lambda x: fn(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=None,
                                                output_final_state=True, use_qk_l2norm_in_kernel=True)


def kda_variants(T: int, *, smoke: bool, stock_max_t: int, eager: bool) -> dict[str, Callable]:
    """``--kda``: the op, its float32-intermediate launches, its ``A`` / ``Aqk`` over 32-column key blocks
    (``kda_cols``), its ``A`` / ``Aqk`` one program per block pair (``kda_split``), fla's ``chunk_kda``,
    transformers' reference compiled by stock Inductor and eager."""
    out: dict[str, Callable] = {"kda": kda, "kda2": lambda x: kda(x, L.KDA._replace(lowp=False)),
                                "kda_cols": lambda x: kda(x, L.KDA._replace(kda_intra_cols=32)),
                                "kda_split": lambda x: kda(x, L.KDA._replace(kda_intra_split=True))}
    fla = None if smoke else kda_fla()
    if fla is not None:
        out["fla"] = fla
    hf = kda_transformers()
    if hf is not None and T <= stock_max_t and not smoke:
        out["stock"] = torch.compile(hf)  # TORCH_KDA_RULE_MEASURED's column (_dynamo_chunk)
    if hf is not None and eager and T <= stock_max_t:
        out["eager"] = hf
    return out


def variants(T: int, *, smoke: bool, stock_max_t: int, eager: bool) -> dict[str, Callable]:
    if KDA_MODE:
        return kda_variants(T, smoke=smoke, stock_max_t=stock_max_t, eager=eager)
    out: dict[str, Callable] = {"kda": kda, "kda3": kda3, "kda2": kda2}
    fla = None if smoke else fla_chunk()
    if fla is not None:
        out["fla"] = fla
    hf = transformers_chunk()
    if hf is not None:
        if T <= stock_max_t and not smoke:
            out["stock"] = _hf_call(torch.compile(hf))
        if eager:
            out["eager"] = _hf_call(hf)
    return out


# --------------------------------------------------------------------------- checks and timing


def reference(x: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """float32: transformers' chunked core on float32 copies (on CPU tensors without transformers:
    the op's token loop)."""
    f = {k: v.float() for k, v in x.items()}
    hf = transformers_chunk()
    if hf is None or KDA_MODE:  # KDA: the op's float32 token loop (on the GPU: seconds at T = 16,384)
        return L.reference(f["q"], f["k"], f["v"], f["g"], f["beta"], None, None, True)
    with torch.inference_mode():
        return _hf_call(hf)(f)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b).norm() / b.norm().clamp_min(1e-30)).item()


def check(fn: Callable, x: dict, want) -> tuple[float | None, float | None, str]:
    try:
        with torch.inference_mode():
            o, state = fn(x)
    except Exception as e:  # noqa: BLE001 - a failing variant is reported, the others go on
        traceback.print_exc()
        return None, None, f"{type(e).__name__}: {e}"[:120]
    return rel(o, want[0]), rel(state, want[1]), ""


def time_us(fn: Callable, x: dict, smoke: bool, T: int) -> tuple[float, str]:
    """CUDA-graph replay median (eager event timing where capture fails: noted)."""
    if smoke:
        return perf_counter_median_us(lambda: fn(x), 1), ""
    reps, inner = (30, 5) if T <= 4096 else (10, 2)
    with torch.inference_mode():
        try:
            return graph_replay_median_us(lambda: fn(x), warmup=2, reps=reps, inner=inner), ""
        except Exception as e:  # noqa: BLE001
            from _timing import eager_median_us

            torch.cuda.synchronize()
            return eager_median_us(lambda: fn(x), reps=5), f"not captured ({type(e).__name__})"


def run_case(T: int, *, device, smoke: bool, stock_max_t: int, eager: bool) -> dict:
    d = (SMOKE_KDA if KDA_MODE else SMOKE) if smoke else (KIMI_LINEAR if KDA_MODE else QWEN3_NEXT)
    x = (make_kda_inputs if KDA_MODE else make_inputs)(d, T, device)
    want = reference(x)
    row: dict = {"T": T}
    notes = []
    for name, fn in variants(T, smoke=smoke, stock_max_t=stock_max_t, eager=eager).items():
        err, serr, problem = check(fn, x, want)
        row[f"{name}_err"], row[f"{name}_state_err"] = err, serr
        if problem:
            notes.append(f"{name}: {problem}")
            continue
        us, note = time_us(fn, x, smoke, T)
        row[f"{name}_us"] = us
        if note:
            notes.append(f"{name}: {note}")
    for peer in ("fla", "stock", "eager"):
        a, b = row.get(f"{peer}_us"), row.get("kda_us")
        row[f"vs_{peer}"] = None if a is None or b is None else a / b
    for key, mine in (("vs_fla2", "kda2_us"), ("vs_fla_split", "kda_split_us")):
        a, b = row.get("fla_us"), row.get(mine)
        row[key] = None if a is None or b is None else a / b
    row["note"] = "; ".join(notes)
    del x, want
    if device == "cuda":
        torch.cuda.empty_cache()
    return row


COLUMNS = (("T", "T", ","), ("kda_us", "kda us", ".1f"), ("kda2_us", "kda2 us", ".1f"),
           ("kda_cols_us", "kda cols us", ".1f"), ("kda_split_us", "kda split us", ".1f"), ("fla_us", "fla us", ".1f"),
           ("stock_us", "stock us", ".1f"), ("eager_us", "eager us", ".1f"), ("vs_fla", "fla/kda", ".2f"),
           ("vs_fla2", "fla/kda2", ".2f"), ("vs_fla_split", "fla/kda split", ".2f"), ("vs_stock", "stock/kda", ".2f"),
           ("kda_err", "kda err", ".2e"), ("kda2_err", "kda2 err", ".2e"), ("kda_cols_err", "kda cols err", ".2e"),
           ("kda_split_err", "kda split err", ".2e"), ("fla_err", "fla err", ".2e"), ("stock_err", "stock err", ".2e"),
           ("eager_err", "eager err", ".2e"), ("kda_state_err", "kda state err", ".2e"),
           ("kda2_state_err", "kda2 state err", ".2e"), ("fla_state_err", "fla state err", ".2e"),
           ("note", "note", "s"))


# --------------------------------------------------------------------------- the per-kernel profile

PROFILE_COLUMNS = (("T", "T", ","), ("variant", "variant", "s"), ("kernel", "kernel", "s"), ("us", "us / call", ".1f"),
                   ("launches", "launches", "d"), ("share", "share", ".0%"))


def _short(name: str, width: int = 60) -> str:
    return name if len(name) <= width else name[:width - 3] + "..."


def profile_case(T: int, *, device, smoke: bool, variants: dict | None = None) -> list[dict]:
    """Each variant's kernels at ``T`` (kda's launches and fla's, by kernel name; ``variants``: these
    instead): one row per kernel, its mean time per call, launches per call and share of the
    variant's kernel time, then a ``total`` row. On CPU (smoke) the operators' self CPU time: the
    code path only."""
    d = SMOKE if smoke else QWEN3_NEXT
    x = make_inputs(d, T, device)
    fns = variants if variants is not None else profiled_variants(smoke)
    rows = []
    for name, fn in fns.items():
        try:
            with torch.inference_mode():
                per = kernel_profile(lambda: fn(x), calls=1 if smoke else 3, warmup=1 if smoke else 2, device=device)
        except Exception as e:  # noqa: BLE001 - one failing variant must not lose the others
            traceback.print_exc()
            rows.append({"T": T, "variant": name, "kernel": f"failed: {type(e).__name__}: {e}"[:120]})
            continue
        total = sum(us for us, _ in per.values()) or 1.0
        for kernel, (us, n) in sorted(per.items(), key=lambda kv: -kv[1][0]):
            rows.append({"T": T, "variant": name, "kernel": _short(kernel), "us": us, "launches": n,
                         "share": us / total})
        rows.append({"T": T, "variant": name, "kernel": "total", "us": total,
                     "launches": sum(n for _, n in per.values()), "share": 1.0})
    del x
    if device == "cuda":
        torch.cuda.empty_cache()
    return rows


def profiled_variants(smoke: bool) -> dict[str, Callable]:
    out: dict[str, Callable] = {"kda": kda, "kda inv doubling": kda_inv, "kda3": kda3, "kda3 fused": kda3_fused,
                                "kda2": kda2}
    fla = None if smoke else fla_chunk()
    if fla is not None:
        out["fla"] = fla
    return out


def run_profile(plan, *, device, smoke: bool, deadline: float, variants: dict | None = None) -> list[dict]:
    rows: list[dict] = []
    for T in plan:
        if time.perf_counter() > deadline:
            print(f"time budget spent: no kernel profile at T = {T}", flush=True)
            break
        rows += profile_case(T, device=device, smoke=smoke, variants=variants)
    print_table(rows, PROFILE_COLUMNS, title="gdn_chunk: kernels per call (torch.profiler, eager launches)")
    return rows


# --------------------------------------------------------------------------- the launch sweep
# (its configs: gdn_chunk_configs.py)


def run_sweep(args, device, deadline) -> list[dict]:
    d = (SMOKE_KDA if KDA_MODE else SMOKE) if args.smoke else (KIMI_LINEAR if KDA_MODE else QWEN3_NEXT)
    rows = []
    plan = [int(t) for t in (args.T or ("70" if args.smoke else "16384")).split(",")]
    configs = kda_sweep_configs(args.smoke) if KDA_MODE else selected_configs(args.smoke, args.configs)
    for i, T in enumerate(plan):  # each T an equal share of the budget left (the first T never takes it all)
        until = time.perf_counter() + (deadline - time.perf_counter()) / (len(plan) - i)
        x = (make_kda_inputs if KDA_MODE else make_inputs)(d, T, device)
        want = reference(x)
        for label, cfg in configs.items():
            if time.perf_counter() > until:
                print(f"T = {T}: its share of the budget spent at {label!r}", flush=True)
                break
            fn = lambda x, cfg=cfg: kda(x, cfg)  # noqa: E731
            err, serr, problem = check(fn, x, want)
            us = None if problem else time_us(fn, x, args.smoke, T)[0]
            rows.append({"T": T, "config": label, "us": us, "err": err, "state_err": serr, "note": problem})
            progress(rows[-1])
    cols = (("T", "T", ","), ("config", "config", "s"), ("us", "us", ".1f"), ("err", "err", ".2e"),
            ("state_err", "state err", ".2e"), ("note", "note", "s"))
    print_table(rows, cols, title="kda::gdn_chunk launch configs")
    table = markdown_table(rows, cols)
    print(table, flush=True)
    if not args.smoke:
        env = environment_info()
        write_out_json(f"bench_{NAME}_sweep.json", {"env": env, "rows": rows})
        if not args.no_record:  # the sweep's section in the results (the last sweep's own file on the device)
            append_markdown(_HERE / "results" / f"{NAME}.md", f"{NAME} benchmark", env, table,
                            f"launch-config sweep (`--sweep`), {_versions()}")
    return rows


def _versions() -> str:
    try:
        from importlib.metadata import version

        fla = version("fla-core")
    except Exception:  # noqa: BLE001
        fla = None
    try:
        import transformers

        tf = transformers.__version__
    except ImportError:
        tf = None
    return f"fla-core {fla}; transformers {tf}; triton {getattr(L.triton, '__version__', None)}"


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help=f"T = {', '.join(map(str, QUICK))} only")
    p.add_argument("--T", default=None, help="tokens, comma-separated (default: the plan's)")
    p.add_argument("--stock-max-t", type=int, default=8192, help="stock torch.compile only up to this T")
    p.add_argument("--no-eager", action="store_true")
    p.add_argument("--sweep", action="store_true", help="time kda's launch configs instead")
    p.add_argument("--configs", default=None,
                   help="with --sweep: only these launch configs (comma-separated labels, in that order)")
    p.add_argument("--profile", action="store_true",
                   help="each variant's kernels by name (torch.profiler) after the timings (on with --quick)")
    p.add_argument("--no-profile", action="store_true", help="no kernel profile with --quick")
    p.add_argument("--budget", type=float, default=480, help="seconds after which no new case starts")
    p.add_argument("--no-record", action="store_true")
    p.add_argument("--smoke", action="store_true", help="tiny CPU run: checks only")
    p.add_argument("--kda", action="store_true", help="a decay per key channel at Kimi Linear's dims")
    args = p.parse_args(argv)
    global KDA_MODE, NAME
    KDA_MODE, NAME = args.kda, "gdn_chunk_kda" if args.kda else "gdn_chunk"
    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (use --smoke on CPU)")
    torch._inductor.config.fx_graph_cache = False  # stock's compile timed as a user's first one would be
    t0 = time.perf_counter()
    deadline = t0 + args.budget
    profile = (args.profile or args.quick) and not args.no_profile and not args.kda
    if args.sweep:
        rows = run_sweep(args, device, deadline)
        if profile:  # with --configs: those configs' kernels (and fla's) instead of the usual variants
            variants = None
            if args.configs and not KDA_MODE:
                variants = {label: (lambda x, cfg=cfg: kda(x, cfg)) for label, cfg in
                            selected_configs(args.smoke, args.configs).items()}
                fla = None if args.smoke else fla_chunk()
                if fla is not None:
                    variants["fla"] = fla
            run_profile([int(t) for t in args.T.split(",")] if args.T else [70 if args.smoke else 16384],
                        device=device, smoke=args.smoke, deadline=deadline + 60, variants=variants)
        return rows
    if args.T:
        plan = [int(t) for t in args.T.split(",")]
    else:
        plan = [70, 130] if args.smoke else list(QUICK if args.quick else TOKENS)
    rows = []
    for T in plan:
        if time.perf_counter() > deadline:
            print(f"time budget of {args.budget:.0f} s spent: T = {plan[len(rows):]} not run", flush=True)
            break
        try:
            rows.append(run_case(T, device=device, smoke=args.smoke, stock_max_t=args.stock_max_t,
                                 eager=not args.no_eager))
        except Exception as e:  # noqa: BLE001 - one failing case must not lose the others
            traceback.print_exc()
            rows.append({"T": T, "note": f"{type(e).__name__}: {e}"[:200]})
        progress(rows[-1])
    d = SMOKE if args.smoke else (KIMI_LINEAR if args.kda else QWEN3_NEXT)
    ref = "the op's float32 token loop (g per key channel, KDA)" if args.kda else \
        "transformers' chunked reference in float32"
    notes = ("NOT meaningful (CPU smoke run)" if args.smoke else
             f"batch 1, {d.k_heads} q / k heads, {d.v_heads} v heads, K = {d.k_dim}, V = {d.v_dim}, bf16 inputs, "
             f"no initial state; CUDA-graph replay medians, one call per graph; err: |o - ref| / |ref| against "
             f"{ref}; {_versions()}")
    print_table(rows, COLUMNS, title=f"{NAME}: {notes}")
    # the profile may start up to a minute past the budget: it takes seconds a T, and is the point of --quick
    prof = run_profile(plan[:len(rows)], device=device, smoke=args.smoke, deadline=deadline + 60) if profile else []
    print(f"({time.perf_counter() - t0:.0f} s)")
    table = markdown_table(rows, COLUMNS)
    if prof:
        table += "\n\nKernels per call (torch.profiler, eager launches, 3 calls after 2 warm-ups):\n\n" + \
            markdown_table(prof, PROFILE_COLUMNS)
    print(table, flush=True)
    if not args.smoke:
        payload = {"benchmark": NAME, "env": environment_info(), "notes": notes, "rows": rows, "profile": prof}
        write_out_json(f"bench_{NAME}.json", payload)
        if not args.no_record:
            results = _HERE / "results"
            write_json(results / f"{NAME}.json", payload)
            append_markdown(results / f"{NAME}.md", f"{NAME} benchmark", payload["env"], table, notes)
    return rows


if __name__ == "__main__":
    main()
