"""``gated_norm_quant`` on a GPU: a GDN layer's gated RMSNorm + dynamic fp8 quantization (vLLM's
``RMSNormGated.forward_static`` then ``QuantFP8.forward_native``, its FP8 output projection), at
T = 1 ... 16384 tokens: eager, stock ``torch.compile``, stock with eager's numerics
(``stock-en``), kda (rewrite forced: the op's default ``GROUP_DIVIDE``, and the same graph with
the op's other two ways to divide by the group scale, ``kda-recip`` and ``kda-ieee``), kda by
the default rules, the floor (bytes read and written over the measured copy bandwidth) and,
with ``--peer-path``, vLLM's unfused Triton kernels. CUDA-graph replay medians.

    python benchmarks/bench_gated_norm_quant.py --cases "vllm H=32" --budget 230       # one case, ~4 min
    python benchmarks/bench_gated_norm_quant.py --cases "vllm H=32" --lean --profile --budget 170
        # ~3 min: stock and kda only, symbolic and static T = 256 ... 16384 (static largest first), kernels
    python benchmarks/bench_gated_norm_quant.py --quick         # T = 1, 256, 16384 only
    python benchmarks/bench_gated_norm_quant.py --peer-path .peers   # + vLLM's Triton kernels
    python benchmarks/bench_gated_norm_quant.py --smoke         # CPU, tiny: the checks only

Cases (:data:`CASES`): vLLM's spelling with group-128 scales at H = 32, 16, 64 heads of 128;
with a float32 norm weight and bf16 input (Qwen3.5-FP8, vLLM #45770); per-token scales
(``GroupShape.PER_TOKEN``, the reciprocal multiply); and the hybrid example's layer tail (the
spec / non-spec merge in front, ``examples/gdn_layers.py`` with ``Fp8Linear``). Each compiled
once with T symbolic (marked dynamic, as vLLM compiles it; T = 1 is Dynamo's own static graph;
:data:`T_VALUES`) and once per T at :data:`STATIC_T` (compiles dominate the run: split it with
``--cases``).

What each system is checked against (``patterns/gated_norm_quant.py``, "Numerics"):

* **eager** as written is the reference of stock: stock's scales and values are compared with
  eager's and the differences recorded (a finding, not a failure): stock drops the norm output's
  bf16 rounding inside its fused kernel and divides approximately. ``stock-en``, the symbolic
  main case compiled with ``emulate_precision_casts`` and ``eager_numerics.division_rounding``
  (where the torch has them), shows what remains with those on;
* **IEEE** (eager with the divisor 448 as a tensor: correctly rounded divisions, what vLLM's CUDA
  ``per_token_group_fp8_quant`` computes and eager on CPU) is kda's reference: every scale must be
  IEEE's of eager's amax or of an amax one bf16 ulp away (the op's norm is within one bf16 ulp
  of eager's), every value within one fp8 step; else the row says FAIL and the run exits 1;
* the peer (vLLM's Triton norm then its Triton group quant, Triton's approximate ``/``) against
  IEEE, recorded.

At the end it prints ``MEASURED['cuda']``, the speed rule's verdicts (faster at a static T: kda
below stock; symbolic: kda never above stock by more than :data:`NEVER_SLOWER`) to paste into
``kda_inductor/patterns/gated_norm_quant.py``. A failing case prints and the sweep goes on;
``--budget`` seconds (default 285) stops it between cases. Results:
``benchmarks/results/gated_norm_quant.{md,json}``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE), str(_HERE.parent)]
import _timing as TM  # noqa: E402

NAME = "gated_norm_quant"
T_VALUES = (1, 256, 1024, 4096, 16384)
"""The symbolic graph's token counts (T = 1 is Dynamo's own static graph)."""
STATIC_T = (256, 1024, 4096, 16384)
"""The static sizes of every case (compiled once per T)."""
QUICK_T = (1, 256, 16384)
FP8_MAX, MIN_SCALE = 448.0, 1.0 / (448.0 * 512.0)
NEVER_SLOWER = 0.03
"""Symbolic graph "never slower": kda within 3% of stock at every T (replay medians of 1-3 us
kernels move by ~50 ns between runs)."""
MODEL_SHAPE = "merge + norm (hybrid layer)"
"""The report's row for the hybrid model's FP8 step: the layer's merge + norm + quant."""


class Case(NamedTuple):
    name: str
    H: int
    fp32_weight: bool = False
    per_token: bool = False
    merged: bool = False
    static: tuple[int, ...] = ()  # static token counts (full run)
    default: bool = False  # also compile with the default rules (kda default)
    peer: bool = False  # vLLM's Triton kernels apply (group quant of the plain norm)


CASES = (
    Case("vllm H=32", 32, static=STATIC_T, default=True, peer=True),
    Case("vllm H=16", 16, static=STATIC_T, default=True, peer=True),
    Case("vllm H=64", 64, static=STATIC_T, default=True, peer=True),
    Case("fp32 weight H=32", 32, fp32_weight=True, static=STATIC_T, default=True, peer=True),
    Case("per token H=32", 32, per_token=True, static=STATIC_T, default=True),
    Case(MODEL_SHAPE, 32, merged=True, static=STATIC_T, default=True),
)
D = 128


# --------------------------------------------------------------------------- the code timed
def gated_norm(x, z, w, eps=1e-6):
    """vLLM's ``RMSNormGated.forward_static`` (norm before gate, silu); float32 math whatever
    the weight's dtype, the output in the input's dtype."""
    dtype = x.dtype
    xf, zf = x.float(), z.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps) * w.float()
    return (out * F.silu(zf)).to(dtype)


def _over_448(a, exact: bool):
    """``a / 448`` as written (eager CUDA: a multiply by fl(1/448)), or correctly rounded."""
    return a / torch.full_like(a, FP8_MAX) if exact else a / FP8_MAX


def group_quant(y, exact: bool = False):
    """``QuantFP8._quantize_group_native``, groups of 128, no padding."""
    xg = y.view(-1, y.shape[-1] // 128, 128)
    amax = xg.abs().max(dim=-1, keepdim=True)[0].float()
    s = _over_448(amax, exact).clamp(min=MIN_SCALE)
    q = (xg / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.view(y.shape), s.squeeze(-1)


def token_quant(y, exact: bool = False):
    """``QuantFP8.forward_native``, dynamic per-token scale, the reciprocal multiply."""
    x_max = y.abs().max(dim=-1)[0].unsqueeze(-1).to(torch.float32)
    s = _over_448(x_max, exact).clamp(min=MIN_SCALE)
    q = (y.to(torch.float32) * s.reciprocal()).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, s


def vllm_group_fp8(x, z, w, exact=False):
    return group_quant(gated_norm(x, z, w).flatten(-2), exact)


def vllm_token_fp8(x, z, w, exact=False):
    return token_quant(gated_norm(x, z, w).flatten(-2), exact)


def merged_group_fp8(o_s, o_ns, s_idx, ns_idx, z, w, exact=False):
    """The hybrid example's layer tail: ``index_copy_`` of both halves into a fresh buffer, the
    norm, the fp8 linear's input quantization."""
    T = s_idx.shape[0] + ns_idx.shape[0]
    out = torch.empty(T, *o_s.shape[1:], dtype=o_s.dtype, device=o_s.device)
    out.index_copy_(0, s_idx, o_s)
    out.index_copy_(0, ns_idx, o_ns)
    return group_quant(gated_norm(out, z, w).flatten(-2), exact)


def program(case: Case) -> Callable:
    if case.merged:
        return merged_group_fp8
    return vllm_token_fp8 if case.per_token else vllm_group_fp8


def norm_output(case: Case, args) -> torch.Tensor:
    """Eager's bf16 norm output ``[T, H * D]`` (what the quantization reads)."""
    if case.merged:
        o_s, o_ns, s_idx, ns_idx, z, w = args
        out = torch.empty(s_idx.shape[0] + ns_idx.shape[0], *o_s.shape[1:], dtype=o_s.dtype, device=o_s.device)
        out.index_copy_(0, s_idx, o_s).index_copy_(0, ns_idx, o_ns)
        return gated_norm(out, z, w).flatten(-2)
    return gated_norm(*args).flatten(-2)


def inputs(case: Case, T: int, device, seed: int = 0) -> tuple:
    """Random bf16 activations, the gate a strided split of the projection (as the layer's), the
    weight around 1 (float32 where the case says); merged: 3/4 of the tokens speculative."""
    g = torch.Generator().manual_seed(seed * 1000 + T)
    H = case.H
    proj = torch.randn(T, 2 * H * D, generator=g).to(torch.bfloat16).to(device)
    z = proj[:, H * D:].view(T, H, D)
    w = 1 + 0.1 * torch.randn(D, generator=g)
    w = (w if case.fp32_weight else w.to(torch.bfloat16)).to(device)
    if not case.merged:
        return torch.randn(T, H, D, generator=g).to(torch.bfloat16).to(device), z, w
    perm = torch.randperm(T, generator=g)
    n_spec = T * 3 // 4
    o_s = torch.randn(n_spec, H, D, generator=g).to(torch.bfloat16).to(device)
    o_ns = torch.randn(T - n_spec, H, D, generator=g).to(torch.bfloat16).to(device)
    return o_s, o_ns, perm[:n_spec].to(device), perm[n_spec:].to(device), z, w


def bytes_moved(case: Case, T: int) -> int:
    """Read the activations and the gate (bf16), write the fp8 values and the float32 scales."""
    W = case.H * D
    scales = T * (1 if case.per_token else W // 128) * 4
    return T * W * (2 + 2 + 1) + scales + D * (4 if case.fp32_weight else 2)


# --------------------------------------------------------------------------- comparing
def _ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance in float32 ulps between two positive float32 tensors."""
    return int((a.view(torch.int32).long() - b.view(torch.int32).long()).abs().max()) if a.numel() else 0


def _steps(q: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Per value, how many fp8 steps (at the reference's magnitude) ``q`` is from ``ref``."""
    from kda_inductor.reference import fp8_step

    a, e = q.float(), ref.float()
    return (a - e).abs() / fp8_step(torch.maximum(a.abs(), e.abs()))


def compare(got, want) -> dict:
    """How ``got = (q, scales)`` differs from ``want``: the share of scales bit-equal, their
    largest distance in ulps, the share of values that differ and the largest difference in fp8
    steps."""
    (q, s), (qe, se) = got, want
    s, se = s.float().reshape(se.shape), se.float()
    steps = _steps(q.reshape(qe.shape), qe)
    return {"scales_exact": float((s == se).float().mean()), "scale_ulps": _ulps(s.contiguous(), se.contiguous()),
            "q_differ": float((steps > 0).float().mean()), "q_steps": float(steps.max()) if steps.numel() else 0.0}


def kda_check(got, exact, y: torch.Tensor, per_token: bool) -> str:
    """"ok" where every scale is IEEE's of eager's amax or of an amax one bf16 ulp away and every
    value is within one fp8 step of IEEE's, else what fails."""
    q, s = got
    yg = y.view(y.shape[0], 1, -1) if per_token else y.view(y.shape[0], -1, 128)
    amax = yg.abs().amax(-1)  # bf16: eager's amax per group
    bits = amax.view(torch.int16)
    near = [(bits + d).view(torch.bfloat16).float() for d in (-1, 0, 1)]
    allowed = [_over_448(a, True).clamp(min=MIN_SCALE) for a in near]
    s = s.float().reshape(allowed[0].shape)
    bad = ~((s == allowed[0]) | (s == allowed[1]) | (s == allowed[2]))
    steps = float(_steps(q.reshape(exact[0].shape), exact[0]).max()) if q.numel() else 0.0
    if bool(bad.any()) or steps > 1:
        return f"FAIL: {int(bad.sum())} scales beyond one bf16 ulp of the amax, values up to {steps:.0f} fp8 steps"
    return "ok"


def summary(c: dict) -> str:
    """``compare``'s dict in a table cell: "scales 97.1% exact (<= 3 ulps); q 0.2% off (<= 1)"."""
    return (f"scales {c['scales_exact']:.1%} exact (<= {c['scale_ulps']} ulps); "
            f"q {c['q_differ']:.2%} off (<= {c['q_steps']:.0f})")


# --------------------------------------------------------------------------- the systems
EAGER_NUMERICS = {"emulate_precision_casts": True, "eager_numerics.division_rounding": True}
"""Stock with eager's numerics (``stock-en``): both knobs exist in torch 2.13 (``division_rounding``
since pytorch#165566, 2025-10); where the torch lacks them the variant is skipped."""


class Run(NamedTuple):
    device: str
    timer: Callable[[Callable], float]
    bandwidth: float | None
    smoke: bool
    peer: object | None  # the peer module (``--peer-path``)
    lean: bool = False  # ``--lean``: stock and kda only, no T = 1, the static sizes largest first
    profile: bool = False  # ``--profile``: each system's kernels at each size


def has_eager_numerics() -> bool:
    import torch._inductor.config as cfg

    return hasattr(cfg, "emulate_precision_casts") and hasattr(getattr(cfg, "eager_numerics", None),
                                                               "division_rounding")


def compiled(case: Case, variant: str, dynamic: bool | None):
    """``program(case)`` compiled as ``variant``: stock, stock-en, kda (forced), default (rules)."""
    fn = program(case)
    if variant.startswith("stock"):
        return torch.compile(fn, backend="inductor", dynamic=dynamic,
                             options=EAGER_NUMERICS if variant == "stock-en" else None)
    options = {"kda": {"force": True}} if variant == "kda" else None
    return torch.compile(fn, backend="kda_inductor", dynamic=dynamic, options=options)


def variants(case: Case, r: Run, symbolic: bool) -> list[str]:
    """stock, stock-en (where the torch has the knobs) and kda always; the default rules where the
    case asks, at static sizes only for the main case (compiles are the run's cost)."""
    main = case.name == CASES[0].name or (r.smoke and case.default)
    if r.lean:
        return ["stock", "kda"]
    out = ["stock", "kda"] + (["default"] if case.default and (symbolic or main) else [])
    if not r.smoke and has_eager_numerics():
        out.insert(1, "stock-en")
    return out


def mark_tokens_dynamic(case: Case, args) -> None:
    """The token dim symbolic, as vLLM compiles the layer (one graph for every T)."""
    for t in args[:-1]:  # every tensor with a token dim: all but the norm's weight
        torch._dynamo.maybe_mark_dynamic(t, 0)


def call_system(label: str, fn, args, refs, case: Case, r: Run) -> dict:
    """One system at one size: its first call (compiling where it must; what it rewrote), its
    numerics against eager and IEEE, kda's check, its replay time."""
    from torch._dynamo.utils import counters

    from kda_inductor import pass_manager

    eager, exact, y = refs
    graphs = counters["stats"]["unique_graphs"]
    t0 = time.perf_counter()
    with pass_manager.counted() as made:
        got = fn(*args)
    out = {f"{label}_vs_eager": summary(compare(got, eager)), f"{label}_vs_ieee": summary(compare(got, exact))}
    if counters["stats"]["unique_graphs"] > graphs:  # this call compiled
        out[f"{label}_compile_s"] = time.perf_counter() - t0
        out[f"{label}_fired"] = made.get(NAME, 0)
        if label == "kda" and made.get(NAME, 0) != 1:
            out["check"] = f"FAIL: kda (forced) rewrote {made.get(NAME, 0)} times, not once"
    if label == "kda" and "check" not in out:
        out["check"] = kda_check(got, exact, y, case.per_token)
    out[f"{label}_us"] = r.timer(lambda: fn(*args))
    if r.profile:
        out[f"{label}_kernels"] = kernels(lambda: fn(*args), r)
    if label == "kda":
        out.update(other_divides(fn, args, refs, case, r))
    return out


def kernels(fn, r: Run, top: int = 3) -> str:
    """``--profile``: the ``top`` kernels of one call by GPU time, "name xlaunches us" each (what
    a system ran: our op's kernel, Inductor's, a fallback's)."""
    per = TM.kernel_profile(fn, calls=3, warmup=1, device=r.device)
    best = sorted(per.items(), key=lambda kv: -kv[1][0])[:top]
    return "; ".join(f"{name[:48]} x{n} {us:.1f}" for name, (us, n) in best)


DIVIDE_LABELS = {"reciprocal": "kda_recip", "ieee": "kda_ieee"}
"""The kda graph's other ways to divide by the group scale (``GROUP_DIVIDE``; ``kda`` is the default's)."""


def other_divides(fn, args, refs, case: Case, r: Run) -> dict:
    """The same compiled kda graph with the op's other ``GROUP_DIVIDE`` modes (read by the op's
    CUDA impl at each call, so at each capture): numerics against eager and IEEE, kda's check,
    the time."""
    from kda_inductor.lowerings import gated_norm_quant as L

    out, default = {}, L.GROUP_DIVIDE
    try:
        for mode, label in DIVIDE_LABELS.items():
            L.GROUP_DIVIDE = mode
            got = fn(*args)
            out[f"{label}_vs_ieee"] = summary(compare(got, refs[1]))
            out[f"{label}_check"] = kda_check(got, refs[1], refs[2], case.per_token)
            out[f"{label}_us"] = r.timer(lambda: fn(*args))
    finally:
        L.GROUP_DIVIDE = default
    return out


def call_peer(case: Case, args, refs, r: Run) -> dict:
    """vLLM's unfused Triton kernels on the same inputs (the plain group-quant cases)."""
    x, z, w = args
    fn = lambda: r.peer.gated_norm_then_group_quant(x, z, w)  # noqa: E731
    got = fn()
    return {"peer_vs_eager": summary(compare(got, refs[0])), "peer_vs_ieee": summary(compare(got, refs[1])),
            "peer_us": r.timer(fn)}


def measure(case: Case, T: int, mode: str, fns: dict, r: Run) -> dict:
    """One row: every system of ``fns`` on fresh inputs of ``T`` tokens, eager, the peer, the floor."""
    args = inputs(case, T, r.device)
    if mode == "symbolic":
        mark_tokens_dynamic(case, args)
    row = {"case": case.name, "T": T, "mode": mode}
    fn = program(case)
    with torch.inference_mode():
        refs = (fn(*args), fn(*args, exact=True), norm_output(case, args))
        for label, compiled_fn in fns.items():
            row.update(call_system(label.replace("-", "_"), compiled_fn, args, refs, case, r))
        if r.peer is not None and case.peer and mode == "symbolic":
            row.update(call_peer(case, args, refs, r))
        row["eager_us"] = r.timer(lambda: fn(*args))
    if r.bandwidth:
        row["floor_us"] = bytes_moved(case, T) / r.bandwidth * 1e6
    return TM.add_ratios(row, (("kda_over_stock", "kda_us", "stock_us"), ("kda_over_floor", "kda_us", "floor_us"),
                               ("default_over_stock", "default_us", "stock_us"),
                               ("recip_over_kda", "kda_recip_us", "kda_us"), ("ieee_over_kda", "kda_ieee_us", "kda_us")))


# --------------------------------------------------------------------------- the sweep
class Job(NamedTuple):
    case: Case
    mode: str  # "symbolic": compiled once for every T; "static": compiled for this T alone
    sizes: tuple[int, ...]


def plan(cases, quick: bool, smoke: bool, lean: bool = False) -> list[Job]:
    """The main case's symbolic and static jobs first, then the other cases' (a spent budget
    keeps the most important rows); ``lean``: no T = 1, the static sizes largest first."""
    def sym(c):
        sizes = ((2, 8) if c is cases[0] else (8,)) if smoke else (QUICK_T if quick else T_VALUES)
        return tuple(t for t in sizes if (t > 1 or not c.merged) and not (lean and t == 1 and not smoke))

    def static(c):
        sizes = ((1,) if c is cases[0] else ()) if smoke else (
            tuple(t for t in c.static if t in QUICK_T) if quick else c.static)
        sizes = sorted(sizes, reverse=lean)
        return [Job(c, "static", (t,)) for t in sizes if t > 1 or not c.merged]  # the merge: T >= 2
    first, rest = cases[0], cases[1:]
    return ([Job(first, "symbolic", sym(first)), *static(first)] + [Job(c, "symbolic", sym(c)) for c in rest]
            + [j for c in rest for j in static(c)])


def run_job(job: Job, r: Run, rows: list[dict], deadline: float) -> None:
    """Compile the job's systems (fresh Dynamo state for a static size) and measure each size;
    a failing size prints and the job goes on."""
    symbolic = job.mode == "symbolic"
    if not symbolic:
        torch._dynamo.reset()
    fns = {v: compiled(job.case, v, None if symbolic else False) for v in variants(job.case, r, symbolic)}
    for T in job.sizes:
        if time.perf_counter() > deadline:
            rows.append({"case": job.case.name, "T": T, "mode": job.mode, "check": "skipped: --budget spent"})
            continue
        try:
            rows.append(measure(job.case, T, job.mode, fns, r))
        except Exception as e:  # noqa: BLE001 - one failing size must not lose the others
            traceback.print_exc(limit=4)
            rows.append({"case": job.case.name, "T": T, "mode": job.mode,
                         "check": f"ERROR: {type(e).__name__}: {str(e).strip().splitlines()[0][:160] if str(e).strip() else ''}"})
        TM.progress(rows[-1])


def verdicts(rows: list[dict], cases=CASES) -> dict:
    """``MEASURED['cuda']`` of the speed rule from the rows: per ``Shape``, the static T where
    kda was below stock and those where not, and whether the symbolic graph was never above
    stock by more than NEVER_SLOWER (cases of one shape must all agree)."""
    from kda_inductor.patterns.gated_norm_quant import Measured, Shape

    by_case = {c.name: c for c in cases}
    acc: dict = {}
    for row in rows:
        c = by_case.get(row["case"])
        if c is None or row.get("kda_us") is None or row.get("stock_us") is None:
            continue
        a = acc.setdefault(Shape(c.merged, c.H * D, c.per_token), {"faster": set(), "slower": set(), "symbolic": []})
        if row["mode"] == "static":
            a["faster" if row["kda_us"] < row["stock_us"] else "slower"].add(row["T"])
        else:
            a["symbolic"].append(row["kda_us"] <= row["stock_us"] * (1 + NEVER_SLOWER))
    return {shape: Measured(tuple(sorted(a["faster"] - a["slower"])), tuple(sorted(a["slower"])),
                            bool(a["symbolic"]) and all(a["symbolic"])) for shape, a in acc.items()}


def measured_literal(table: dict) -> str:
    """The ``MEASURED['cuda']`` literal to paste into patterns/gated_norm_quant.py."""
    lines = [f"    {shape!r}: {m!r}," for shape, m in sorted(table.items())]
    return "MEASURED['cuda'] = {\n" + "\n".join(lines) + "\n}"


TIME_COLUMNS = (("case", "case", "s"), ("T", "T", ","), ("mode", "T is", "s"), ("eager_us", "eager us", ".2f"),
                ("stock_us", "stock us", ".2f"), ("stock_en_us", "stock-en us", ".2f"), ("kda_us", "kda us", ".2f"),
                ("kda_recip_us", "kda-recip us", ".2f"), ("kda_ieee_us", "kda-ieee us", ".2f"),
                ("default_us", "kda default us", ".2f"), ("default_fired", "default fired", "d"),
                ("peer_us", "vLLM Triton us", ".2f"), ("floor_us", "floor us", ".2f"),
                ("kda_over_stock", "kda/stock", ".3f"), ("kda_over_floor", "kda/floor", ".2f"))
KERNEL_COLUMNS = (("case", "case", "s"), ("T", "T", ","), ("mode", "T is", "s"), ("stock_kernels", "stock", "s"),
                  ("kda_kernels", "kda", "s"))
NUM_COLUMNS = (("case", "case", "s"), ("T", "T", ","), ("mode", "T is", "s"), ("stock_vs_eager", "stock vs eager", "s"),
               ("stock_en_vs_eager", "stock-en vs eager", "s"), ("kda_vs_ieee", "kda vs IEEE", "s"),
               ("kda_vs_eager", "kda vs eager", "s"), ("kda_recip_vs_ieee", "kda-recip vs IEEE", "s"),
               ("kda_ieee_vs_ieee", "kda-ieee vs IEEE", "s"), ("peer_vs_ieee", "vLLM Triton vs IEEE", "s"),
               ("check", "kda check", "s"))


# --------------------------------------------------------------------------- report.py
def report_jobs(s) -> list:
    """``benchmarks/report.py``'s rows (``s``: its ``Settings``): vLLM's spelling at the report's
    sizes and the hybrid layer's merge + norm + quant at the model's steps (static T, kda forced;
    ``kda_no_us``: gated_norm_quant disabled, the norm then ``gated_norm_merge``'s)."""
    H = 2 if s.smoke else 32
    r = Run(s.device, s.timer, s.bandwidth, s.smoke, None)
    plain, merged = Case(f"vllm H={H}", H), Case(MODEL_SHAPE, H, merged=True)

    def job(case, T):
        torch._dynamo.reset()
        fns = {"stock": compiled(case, "stock", False), "kda": compiled(case, "kda", False)}
        if case.merged:
            fns["no"] = torch.compile(program(case), backend="kda_inductor", dynamic=False,
                                      options={"kda": {"disable": [NAME], "force": True}})
        row = measure(case, T, "static", fns, r)
        if row.get("check", "ok") != "ok":
            raise AssertionError(f"{case.name} T={T}: {row['check']}")
        return {"rewrite": NAME, "shape": case.name, **row, "kda_no_us": row.get("no_us")}
    return ([lambda T=T: job(plain, T) for T in s.sizes]
            + [lambda T=T: job(merged, T) for T in sorted(set(s.all_steps.values()))])


def step_regions(rows: list[dict], step_row: dict) -> dict:
    """The regions this rewrite replaces in one of ``report.py``'s model steps, from its rows
    (``report_jobs``): the GDN and the KDA layer's merge + norm + quant (two), where the step's
    compile rewrote them. ``{label: (row, count)}``."""
    row = next((x for x in rows if x["rewrite"] == NAME and x["shape"] == MODEL_SHAPE and x["T"] == step_row["T"]),
               None)
    return {} if row is None else {f"{NAME} x2": (row, 2)}


# --------------------------------------------------------------------------- main
def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help=f"T in {QUICK_T} only (~2 min)")
    p.add_argument("--cases", default=None, help="comma list of case names (default: all); see CASES")
    p.add_argument("--reps", type=int, default=20, help="timed samples per number")
    p.add_argument("--budget", type=float, default=285, help="seconds; the sizes after it are skipped")
    p.add_argument("--peer-path", default=None, help="a folder with vllm_gated_norm_quant.py (.peers)")
    p.add_argument("--no-record", action="store_true")
    p.add_argument("--smoke", action="store_true", help="tiny CPU run: checks only")
    p.add_argument("--lean", action="store_true", help="stock and kda only, T >= 256, static sizes largest first")
    p.add_argument("--profile", action="store_true", help="each system's top kernels at each size")
    return p.parse_args(argv)


def setup(args) -> tuple[Run, list[Case]]:
    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (use --smoke on CPU)")
    cases = list(CASES)
    if args.cases:
        want = {c.strip() for c in args.cases.split(",")}
        cases = [c for c in CASES if c.name in want] or SystemExit(f"--cases: none of {sorted(want)} in CASES")
    if args.smoke:  # two heads: tiny compiles; H=16 / 64 are the main case's code at other sizes
        cases = [c._replace(H=2, name=c.name.replace("H=32", "H=2"), default=c is CASES[0])
                 for c in cases if c.H == 32]
    peer = None
    if args.peer_path and not args.smoke:
        sys.path.insert(0, str(Path(args.peer_path).resolve()))
        try:
            peer = importlib.import_module("vllm_gated_norm_quant")
        except Exception as e:  # noqa: BLE001 - the sweep runs without the peer
            print(f"--peer-path {args.peer_path}: no peer ({type(e).__name__}: {e})")
    device = "cpu" if args.smoke else "cuda"
    timer = ((lambda fn: TM.perf_counter_median_us(fn, 1)) if args.smoke
             else (lambda fn: TM.graph_replay_median_us(fn, reps=args.reps, inner=3, calls=10)))
    bandwidth = None if args.smoke else TM.measure_copy_bandwidth(device)
    torch._inductor.config.force_disable_caches = True
    for knob in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 64)
    return Run(device, timer, bandwidth, args.smoke, peer, args.lean, args.profile), cases


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    r, cases = setup(args)
    t0, rows = time.perf_counter(), []
    for job in plan(cases, args.quick, args.smoke, r.lean):
        try:
            run_job(job, r, rows, t0 + args.budget)
        except Exception as e:  # noqa: BLE001 - a case that fails to compile: the others still run
            traceback.print_exc(limit=4)
            rows.append({"case": job.case.name, "T": job.sizes[0], "mode": job.mode,
                         "check": f"ERROR: {type(e).__name__}: {str(e).strip()[:160]}"})
    finish(args, r, rows, t0)
    return rows


def finish(args, r: Run, rows: list[dict], t0: float) -> None:
    """Print both tables and the speed rule's literal; record them (unless smoke / --no-record);
    exit 1 where a kda check failed or a size errored."""
    table = measured_literal(verdicts(rows)) if not r.smoke else "(smoke: no verdicts)"
    notes = ("NOT meaningful (CPU smoke run)" if r.smoke else
             f"CUDA-graph replay medians (10 calls per graph); copy bandwidth {r.bandwidth / 1e12:.2f} TB/s; bf16 "
             "activations, the gate a strided split of the projection, D=128; kda forced, kda default by the rules; "
             "numerics: share of scales bit-equal (largest distance, float32 ulps), share of fp8 values off "
             "(largest distance, fp8 steps); IEEE = correctly rounded divisions (vLLM's CUDA kernel)")
    profiled = any(row.get("kda_kernels") for row in rows)
    text = (f"{NAME}: {notes}\n\nnumerics\n" + TM.markdown_table(rows, NUM_COLUMNS) + "\ntimes\n"
            + TM.markdown_table(rows, TIME_COLUMNS)
            + (f"\nkernels (top 3 by GPU time: launches, us a call)\n" + TM.markdown_table(rows, KERNEL_COLUMNS)
               if profiled else "") + f"\nspeed rule, paste into patterns/gated_norm_quant.py:\n\n"
            f"```python\n{table}\n```\n")
    print(text + f"({time.perf_counter() - t0:.0f} s)")
    bad = [f"{row['case']} T={row['T']} {row['mode']}: {row['check']}" for row in rows
           if str(row.get("check", "ok")).startswith(("FAIL", "ERROR"))]
    if not r.smoke:
        payload = {"benchmark": NAME, "env": TM.environment_info(), "notes": notes, "rows": rows,
                   "measured_literal": table, "failures": bad, "seconds": time.perf_counter() - t0}
        TM.write_out_json(f"bench_{NAME}.json", payload)
        if not args.no_record:
            TM.record_results(NAME, payload, text.split("\n\n", 1)[1], results_dir=_HERE / "results",
                              title=f"{NAME} benchmark", notes=notes)
    if bad:
        print("\n".join(["FAILURES:", *bad]))
        raise SystemExit(1)


if __name__ == "__main__":
    main()
