"""``gdn_recurrent_step`` on a GPU: the gated delta rule's decode / verify recurrence (T = 1..8 tokens
continuing a float32 state) at the real models' dims, as transformers runs it and as our op does.

Variants, each checked against the float32 reference first (``reference_step``: the op's spec, the
token loop in float32 torch; ``check``), then timed:

* ``kda``: ``kda::gdn_recurrent_step_inplace`` (the state read and overwritten in place: what the
  rewrite emits); ``kda oop``: ``kda::gdn_recurrent_step`` (a new final state, FLA's contract).
* ``stock``: stock ``torch.compile`` of transformers' step as the layer calls it for decode: its
  torch loop (``torch_recurrent_gated_delta_rule`` of qwen3_next / olmo_hybrid,
  ``recurrent_kimi_delta_attention`` of kimi_linear, the hub / fla dispatch around them unwrapped)
  with its prologue (fp32 casts, q / k l2norm, the 1 / sqrt(K) scale, the GQA repeat), then the
  cache's ``state.copy_(new_state)``; ``eager``: the same uncompiled.
* ``fla``: flash-linear-attention's ``fused_recurrent_gated_delta_rule`` / ``fused_recurrent_kda``
  (fla-core; called with keywords: the 5th positional argument of the first is ``gk``), which
  returns a new state, where importable.
* ``floor``: the bytes that must move (the state read and written, q / k / v / g / beta read, the
  output written) over the copy bandwidth measured at the start of the same run.

Inputs as the layer makes them: q / k / v are the token-major split views of one bf16 projection
``[B, T, 2 Hk K + Hv V]`` (strided, not copied), ``g`` float32 log-decay, ``beta`` bf16, the state
float32 ``[B, Hv, K, V]``. Times are CUDA-graph replay medians of 10 calls per graph (per call),
each variant timed twice (two captures: ``spread`` is the largest relative difference of the two
over the variants); where one input set would sit in L2 (50 MB), calls rotate over enough sets
that the data a call reads was last touched ~100 MB earlier (a decode step's other layers evict
it too). Models: Qwen3-Next / Qwen3.5 (16 key / 32 value heads, K = V = 128), Kimi Linear (32 / 32,
128 / 128, decay per key channel), OLMo-hybrid (30 / 30, K = 96, V = 192).

    python benchmarks/bench_gdn_recurrent_step.py --quick --budget 420   # the targets' cases (~5-7 min)
    python benchmarks/bench_gdn_recurrent_step.py --budget 540           # every model x B x T (past the budget: partial)
    python benchmarks/bench_gdn_recurrent_step.py --no-stock --no-eager  # every case, kda / FLA / floor only (~2 min)
    python benchmarks/bench_gdn_recurrent_step.py --sweep --budget 170   # launch configs, T 1..8 x B 1..128 (~150 s)
    python benchmarks/bench_gdn_recurrent_step.py --verify --budget 150  # T 1/2/4/8 x B 1/32/128, GDN + KDA,
                                                                         # with the --candidates launches (~4 min)
    python benchmarks/bench_gdn_recurrent_step.py --sweep --budget 150 --candidates pst16w1x8s2,...  # + regs
    python benchmarks/bench_gdn_recurrent_step.py --smoke                # CPU, tiny: the code paths only

No new case starts after ``--budget`` seconds; the rows done are recorded (``benchmarks/results/
gdn_recurrent_step.{md,json}``, and ``$OUT/bench_gdn_recurrent_step.json`` when ``OUT`` is set).
"""

from __future__ import annotations

import argparse
import inspect
import math
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, NamedTuple

import torch

if "--smoke" in sys.argv and not torch.cuda.is_available():  # the sweep's kernel on CPU tensors (before triton)
    os.environ.setdefault("TRITON_INTERPRET", "1")
_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE), str(_HERE.parent), str(_HERE.parent / "examples")]
from _timing import (  # noqa: E402
    add_ratios,
    environment_info,
    finish,
    graph_replay_median_us,
    markdown_table,
    measure_copy_bandwidth,
    perf_counter_median_us,
    print_table,
    progress,
    write_out_json,
)

from kda_inductor.lowerings import gdn_recurrent_step as L  # noqa: E402

NAME = "gdn_recurrent_step"
CALLS = 10
"""Calls per captured graph (the host's graph-launch cost amortized)."""
L2_BYTES = 50 << 20
BATCHES = (1, 8, 32, 64, 128, 256)
TOKENS = (1, 2, 4, 8)


class Model(NamedTuple):
    k_heads: int
    v_heads: int
    k_dim: int
    v_dim: int
    per_channel: bool


MODELS = {"qwen3_next": Model(16, 32, 128, 128, False), "kimi_linear": Model(32, 32, 128, 128, True),
          "olmo_hybrid": Model(30, 30, 96, 192, False)}
SMOKE_MODELS = {"qwen3_next": Model(1, 2, 16, 16, False), "kimi_linear": Model(2, 2, 16, 8, True)}
COLUMNS = (("model", "model", "s"), ("B", "B", ","), ("T", "T", ","), ("kda_us", "kda us", ".2f"),
           ("kda_oop_us", "kda oop us", ".2f"), ("stock_us", "stock us", ".2f"), ("eager_us", "eager us", ".1f"),
           ("fla_us", "FLA us", ".2f"), ("floor_us", "floor us", ".2f"), ("kda_over_floor", "kda/floor", ".2f"),
           ("kda_over_stock", "kda/stock", ".3f"), ("kda_over_fla", "kda/FLA", ".3f"),
           ("oop_over_fla", "oop/FLA", ".3f"), ("spread", "spread %", ".1f"), ("check", "check", "s"),
           ("note", "note", "s"))


# --------------------------------------------------------------------------- inputs


def make_inputs(m: Model, B: int, T: int, device, seed: int = 0) -> dict:
    """One decode step's tensors as the layer makes them (see the module docstring)."""
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(B, T, 2 * m.k_heads * m.k_dim + m.v_heads * m.v_dim, generator=gen).to(torch.bfloat16)
    q, k, v = torch.split(qkv.to(device), [m.k_heads * m.k_dim, m.k_heads * m.k_dim, m.v_heads * m.v_dim], dim=-1)
    gshape = (B, T, m.v_heads, m.k_dim) if m.per_channel else (B, T, m.v_heads)
    g = -torch.nn.functional.softplus(torch.randn(*gshape, generator=gen)).to(device)
    beta = torch.sigmoid(torch.randn(B, T, m.v_heads, generator=gen)).to(torch.bfloat16).to(device)
    state = (0.1 * torch.randn(B, m.v_heads, m.k_dim, m.v_dim, generator=gen)).to(device)
    return dict(q=q.unflatten(-1, (m.k_heads, m.k_dim)), k=k.unflatten(-1, (m.k_heads, m.k_dim)),
                v=v.unflatten(-1, (m.v_heads, m.v_dim)), g=g, beta=beta, state=state, scale=m.k_dim ** -0.5)


def bytes_moved(m: Model, B: int, T: int) -> int:
    state = B * m.v_heads * m.k_dim * m.v_dim * 4
    per_token = B * T * (2 * (2 * m.k_heads * m.k_dim + m.v_heads * m.v_dim) + 4 * m.v_heads
                         * (m.k_dim if m.per_channel else 1) + 2 * m.v_heads + 2 * m.v_heads * m.v_dim)
    return 2 * state + per_token


def input_sets(m: Model, B: int, T: int, device, smoke: bool) -> list[dict]:
    """Enough input sets (up to 32) that rotating over them reads ~2x L2 between two touches of one."""
    n = 1 if smoke else max(1, min(32, math.ceil(2 * L2_BYTES / bytes_moved(m, B, T))))
    return [make_inputs(m, B, T, device, seed) for seed in range(n)]


# --------------------------------------------------------------------------- the variants


def kimi_loop(query, key, value, g, beta, initial_state, output_final_state, use_qk_l2norm_in_kernel=False):
    """Kimi Linear's decode loop as transformers writes it (``recurrent_kimi_delta_attention``:
    float32 casts, ``x / sqrt(sum(x * x) + 1e-6)``, ``q * K ** -0.5``, the decay per key channel),
    for a transformers without ``kimi_linear`` (5.17, on the GPU machine)."""
    dtype = query.dtype
    q, k, v, g, beta = (x.float() for x in (query, key, value, g, beta))
    if use_qk_l2norm_in_kernel:
        q, k = (x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6) for x in (q, k))
    q = q * q.shape[-1] ** -0.5
    S = initial_state.to(v)
    out = torch.zeros_like(v)
    for i in range(q.shape[1]):
        S = S * g[:, i].exp()[..., None]
        delta = (v[:, i] - (S * k[:, i, ..., None]).sum(-2)) * beta[:, i, ..., None]
        S = S + k[:, i, ..., None] * delta.unsqueeze(-2)
        out[:, i] = (S * q[:, i, ..., None]).sum(-2)
    return out.to(dtype), S if output_final_state else None


def _transformers_loop(model: str) -> tuple[Callable | None, str]:
    """transformers' torch loop for ``model`` (unwrapped from the hub / fla dispatch); where this
    transformers has no such model: the qwen3_next loop for OLMo-hybrid (the same code), the
    spelling above for Kimi Linear."""
    name = "recurrent_kimi_delta_attention" if model == "kimi_linear" else "torch_recurrent_gated_delta_rule"
    for mod in ((model,) if model != "olmo_hybrid" else ("olmo_hybrid", "qwen3_next")):
        try:
            module = __import__(f"transformers.models.{mod}.modeling_{mod}", fromlist=[name])
            return inspect.unwrap(getattr(module, name)), f"transformers {mod}"
        except (ImportError, AttributeError):
            continue
    if model == "kimi_linear":
        return kimi_loop, "kimi_loop (this transformers has no kimi_linear)"
    return None, "no transformers loop"


def repeat_heads(q, k, v_heads: int):
    """q / k with their heads repeated to ``v_heads`` (``repeat_interleave``), as the layer does
    before calling the loop in transformers <= 5.17, whose ``torch_recurrent_gated_delta_rule``
    takes as many q / k heads as v heads (5.25's repeats inside, where they differ: a no-op there
    after this)."""
    group = v_heads // q.shape[2]
    return (q, k) if group == 1 else (q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2))


def transformers_step(model: str) -> tuple[Callable | None, str]:
    """The step as the layer runs it for decode: transformers' loop (prologue included), then the
    cache update ``state.copy_(new_state)``; returns the output."""
    loop, where = _transformers_loop(model)
    if loop is None:
        return None, where

    def step(x):
        if model == "kimi_linear":
            out, new = loop(x["q"], x["k"], x["v"], x["g"], x["beta"], x["state"], True, use_qk_l2norm_in_kernel=True)
        else:
            q, k = repeat_heads(x["q"], x["k"], x["v"].shape[2])
            out, new = loop(q, k, x["v"], g=x["g"], beta=x["beta"], initial_state=x["state"],
                            output_final_state=True, use_qk_l2norm_in_kernel=True)
        x["state"].copy_(new)
        return out

    return step, where


def kda_inplace(x):
    return torch.ops.kda.gdn_recurrent_step_inplace(x["q"], x["k"], x["v"], x["g"], x["beta"], x["state"],
                                                   x["scale"], True)


def kda_oop(x):
    return torch.ops.kda.gdn_recurrent_step(x["q"], x["k"], x["v"], x["g"], x["beta"], x["state"], x["scale"], True)


def fla_step(m: Model) -> Callable | None:
    """FLA's fused recurrent kernel (a new state), or None where fla-core is not importable."""
    try:
        import fla_core

        if not fla_core.available():
            return None
        ns = fla_core.fla()
    except Exception:  # noqa: BLE001 - not installed, or its import fails here
        traceback.print_exc()
        return None
    fn = ns.kda_recurrent if m.per_channel else ns.gdn_recurrent
    return lambda x: fn(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], scale=x["scale"],
                        initial_state=x["state"], output_final_state=True, use_qk_l2norm_in_kernel=True)


# --------------------------------------------------------------------------- checks and timing


def _clone_set(x: dict) -> dict:
    return {k: (v.clone() if k == "state" else v) for k, v in x.items()}


def check(fn: Callable, x: dict, inplace: bool) -> tuple[str, float | None]:
    """``fn`` on a copy of ``x`` against the float32 reference: ``("ok" | "BAD ..." | error, max
    relative output error)``. Outputs within two bf16 steps of the output's scale, the state within
    1e-4 of its scale (float32 sums in another order differ by ~1e-6)."""
    want, want_state = L.reference_step(x["q"], x["k"], x["v"], x["g"], x["beta"], x["state"], x["scale"], True)
    y = _clone_set(x)
    try:
        with torch.inference_mode():
            got = fn(y)
    except Exception as e:  # noqa: BLE001 - a failing variant is reported, the others go on
        traceback.print_exc()
        return f"{type(e).__name__}: {e}"[:100], None
    out, state = (got, y["state"]) if inplace or not isinstance(got, tuple) else got
    err_o = ((out.float() - want).abs().max() / want.abs().max()).item()
    err_s = ((state - want_state).abs().max() / want_state.abs().max()).item()
    ok = err_o <= 2 * 2 ** -8 and err_s <= 1e-4
    return ("ok" if ok else f"BAD out {err_o:.2g} state {err_s:.2g}"), err_o


def graphed_fns(fn: Callable, sets: list[dict]) -> list[Callable]:
    """Callables of ``CALLS`` calls each, over the sets in turn (one graph each)."""
    n = len(sets)
    return [lambda g=g: [fn(sets[(g * CALLS + c) % n]) for c in range(CALLS)] for g in range(math.ceil(n / CALLS))]


def gpu_timer(reps: int) -> Callable[[list[Callable]], float]:
    return lambda fns: graph_replay_median_us(fns, warmup=2, reps=reps, inner=2) / CALLS


def smoke_timer(fns: list[Callable]) -> float:
    return perf_counter_median_us(fns[0], 1) / CALLS


def time_twice(timer, fn: Callable, sets: list[dict]) -> list[float]:
    with torch.inference_mode():
        return [timer(graphed_fns(fn, sets)) for _ in range(2)]


# --------------------------------------------------------------------------- one case


def variants(model: str, m: Model, *, stock: bool, eager: bool) -> tuple[dict, str]:
    """name -> (callable(x), writes the state in place); the note says what stock runs."""
    out = {"kda": (kda_inplace, True), "kda_oop": (kda_oop, False)}
    step, where = transformers_step(model)
    if step is not None and stock:
        out["stock"] = (torch.compile(step, dynamic=False), True)
    if step is not None and eager:
        out["eager"] = (step, True)
    fla = fla_step(m)
    if fla is not None:
        out["fla"] = (fla, False)
    return out, where


def run_case(model: str, m: Model, B: int, T: int, *, device, timer, bandwidth, smoke=False, stock=True,
             eager=True) -> dict:
    torch._dynamo.reset()
    sets = input_sets(m, B, T, device, smoke)
    fns, where = variants(model, m, stock=stock, eager=eager)
    row = {"model": model, "B": B, "T": T, "note": f"stock: {where}" if "stock" in fns else "", "sets": len(sets)}
    checks, spread = [], 0.0
    for name, (fn, inplace) in fns.items():
        t0 = time.perf_counter()
        verdict, err = check(fn, sets[0], inplace)
        if name == "stock":
            row["stock_compile_s"] = round(time.perf_counter() - t0, 1)
        checks.append(f"{name} {verdict}")
        if verdict != "ok":
            continue
        runs = time_twice(timer, fn, sets)
        row[f"{name}_us"], row[f"{name}_runs"] = sum(runs) / 2, runs
        spread = max(spread, 100 * abs(runs[0] - runs[1]) / min(runs))
    row["check"] = "; ".join(c for c in checks if not c.endswith(" ok")) or "all ok"
    row["spread"] = spread
    if bandwidth:
        row["floor_us"] = bytes_moved(m, B, T) / bandwidth * 1e6
    return add_ratios(row, (("kda_over_floor", "kda_us", "floor_us"), ("kda_over_stock", "kda_us", "stock_us"),
                            ("kda_over_fla", "kda_us", "fla_us"), ("oop_over_fla", "kda_oop_us", "fla_us")))


# --------------------------------------------------------------------------- the plan


def plan(quick: bool, smoke: bool) -> list[tuple[str, int, int]]:
    """``(model, B, T)`` in priority order (a spent budget drops the last): the targets' cases
    first (Qwen3-Next T = 1 at every B; T = 4 at 32 / 128; the other models at 32 / 128), then
    the rest of the grid (``--quick``: the first part only)."""
    if smoke:
        return [("qwen3_next", 1, 1), ("kimi_linear", 2, 3)]
    first = [("qwen3_next", B, 1) for B in BATCHES] + [("qwen3_next", B, 4) for B in (32, 128)]
    first += [(name, B, 1) for name in ("kimi_linear", "olmo_hybrid") for B in (32, 128)]
    if quick:
        return first
    rest = [(name, B, T) for name in MODELS for T in TOKENS for B in BATCHES]
    return first + [c for c in rest if c not in first]


# --------------------------------------------------------------------------- the sweep


SWEEP_CONFIGS = ((16, 1, False), (64, 4, False), (32, 2, False), (8, 1, False), (16, 1, True), (64, 4, True))
"""``(BV, warps, SCALED)``: the table's two launches, the runners-up of the 2026-12-03 sweep (32 x 2 near
the best everywhere; 8 x 1: twice the programs of 16 x 1 for small batches), and the SCALED body at the
table's two launches."""
SWEEP_SHAPES = tuple(("qwen3_next", B, T) for T in (1, 2, 4, 8) for B in (1, 8, 32, 128))


def sweep(device, timer, bandwidth, smoke: bool, deadline: float, configs=None) -> list[dict]:
    """The kernel alone (``step_triton``, in place) over launch configs (``configs``, default
    :data:`SWEEP_CONFIGS`): the input to ``launch_config``."""
    rows = []
    shapes = (("qwen3_next", 2, 1),) if smoke else SWEEP_SHAPES
    for model, B, T in shapes:
        m = (SMOKE_MODELS if smoke else MODELS)[model]
        sets = input_sets(m, B, T, device, smoke)
        default = L.launch_config(B, m.v_heads, m.k_dim, m.v_dim, T)
        fixed = ((16, 1, True),) if smoke else SWEEP_CONFIGS
        cands = configs or [L.LaunchConfig(bv, w, 1, sc) for bv, w, sc in fixed]
        for cfg in cands:
            if time.perf_counter() > deadline:
                print(f"sweep: time budget spent at {model} B={B} T={T}", flush=True)
                return rows
            fn = (lambda x, cfg=cfg: L.step_triton(x["q"], x["k"], x["v"], x["g"], x["beta"], x["state"],
                                                    x["scale"], True, inplace=True, config=cfg)[0])
            try:
                regs, spills = registers(sets[0], cfg)
                us = timer(graphed_fns(fn, sets))
            except Exception as e:  # noqa: BLE001
                us = regs = spills = None
                print(f"sweep {model} B={B} T={T} {cfg}: {type(e).__name__}: {e}", flush=True)
            label = (config_label(cfg) if configs else
                     f"BV{cfg.block_v} w{cfg.num_warps}" + (" scaled" if cfg.scaled else ""))
            rows.append({"model": model, "B": B, "T": T, "config": label, "us": us, "regs": regs, "spills": spills,
                         "default": "yes" if cfg == default else "",
                         "floor_us": bytes_moved(m, B, T) / bandwidth * 1e6 if bandwidth else None})
    return rows


def registers(x: dict, cfg) -> tuple[int | None, int | None]:
    """One launch of ``cfg`` on a copy of ``x`` (outside any graph): the compiled kernel's registers
    per thread and spills (None where this Triton's handle does not say)."""
    meta = L.validate(x["q"], x["k"], x["v"], x["g"], x["beta"], x["state"], x["scale"], True)
    state = x["state"].clone()
    out = x["v"].new_empty(x["v"].shape)
    kernel = L._launch(x["q"], x["k"], x["v"], x["g"], x["beta"], state, state, out, x["scale"], True, 1e-6, meta,
                       cfg)
    return getattr(kernel, "n_regs", None), getattr(kernel, "n_spills", None)


def _mark_best(rows: list[dict]) -> None:
    for key in {(r["model"], r["B"], r["T"]) for r in rows}:
        mine = [r for r in rows if (r["model"], r["B"], r["T"]) == key and r["us"] is not None]
        for r in mine:
            r["best"] = "best" if r is min(mine, key=lambda r: r["us"]) else ""
            r["over_floor"] = r["us"] / r["floor_us"] if r.get("floor_us") else None


# --------------------------------------------------------------------------- the verify window


_FIRST = (("qwen3_next", 32, 4), ("qwen3_next", 128, 4), ("qwen3_next", 1, 1), ("kimi_linear", 32, 4))
VERIFY_CASES = _FIRST + tuple(c for c in ((model, B, T) for model in ("qwen3_next", "kimi_linear")
                                          for T in (1, 2, 4, 8) for B in (1, 32, 128)) if c not in _FIRST)
"""The issue's targets first (a spent ``--budget`` drops the last)."""
CANDIDATES = "seq16w1,seq16w1r128,seq8w1,seq8w1r96,pst16w1x12s2r168+lazy"
"""``--candidates``' default: the token-by-token body at the table's T > 1 launch and at 8 columns (B = 1:
twice the programs), each also held to fewer registers (``r``: 16 x 1 at 128, 16 programs an SM instead
of 12, and 8 x 1 at 96, 21: sm_90, Triton 3.9, T = 4, no spills either), and the lazy persistent body
held to 168 registers (``pst``: 12 programs per SM, 2 pipeline stages, the tile held as ``S / c``: the
closest at B = 1, 4.09 against the table's 4.22 us). The other persistent launches lost at every case
timed (H100, 2026-12-06 and 2026-12-07, ``benchmarks/results/gdn_recurrent_step.md``): still parsed
(``--candidates pst16w1x8s2``), no longer timed by default, so that a budget reaches the cases. (The
window on tensor cores lost every case too and is gone: ``gdn_recurrent_step_window_dot.md``.)"""


def parse_config(label: str) -> L.LaunchConfig:
    """``seq16w1`` / ``win32w4`` / ``pst16w1x8s2`` (``+scaled``): body, columns per program, warps; for
    ``pst`` (the persistent body) programs per SM and pipeline stages; ``r128``: at most 128 registers a
    thread; ``+lazy`` (``pst``): the tile held as ``S / c``; ``+loop`` (``pst``): the runtime token loop."""
    import re

    got = re.fullmatch(r"(seq|win|pst)(\d+)w(\d+)(?:x(\d+)s(\d+))?(?:r(\d+))?(\+scaled)?(\+lazy)?(\+loop)?",
                       label.strip())
    if got is None or (got[1] == "pst") != bool(got[4]) or ((got[8] or got[9]) and got[1] != "pst"):
        raise SystemExit(f"--candidates: {label!r} is not like seq16w1(r128), win32w4 or pst16w1x8s2(r168) "
                         "(+scaled, +lazy, +loop)")
    return L.LaunchConfig(int(got[2]), int(got[3]), int(got[5] or 1), bool(got[7]), got[1] == "win",
                          int(got[4] or 0), not got[9], int(got[6] or 0), bool(got[8]))


def config_label(cfg: L.LaunchConfig) -> str:
    body = "pst" if cfg.persistent else "win" if cfg.window else "seq"
    label = f"{body}{cfg.block_v}w{cfg.num_warps}" + (f"x{cfg.persistent}s{cfg.num_stages}" if cfg.persistent else "")
    label += (f"r{cfg.max_registers}" if cfg.max_registers else "") + ("+scaled" if cfg.scaled else "")
    label += "+lazy" if cfg.persistent and cfg.lazy else ""
    return label + ("+loop" if cfg.persistent and not cfg.unroll else "")


def _timed(row: dict, key: str, fn: Callable, sets: list[dict], inplace: bool, timer) -> None:
    """``fn`` checked, then timed twice: ``row[key + "_us"]`` (their mean) and its spread, or the
    failed check in ``row["check"]``."""
    verdict, _ = check(fn, sets[0], inplace)
    if verdict != "ok":
        row["check"] = (row.get("check", "") + f"; {key} {verdict}").lstrip("; ")
        return
    runs = time_twice(timer, fn, sets)
    row[f"{key}_us"], row[f"{key}_spread"] = sum(runs) / 2, 100 * abs(runs[0] - runs[1]) / min(runs)


def verify_case(model: str, B: int, T: int, cands: list, *, smoke: bool, device, timer, bandwidth) -> dict:
    """One case of ``--verify``: the op (its table's launch), FLA, the floor, each candidate launch."""
    m = (SMOKE_MODELS if smoke else MODELS)[model]
    sets = input_sets(m, B, T, device, smoke)
    row = table_row_info(model, m, B, T)
    _timed(row, "kda", kda_inplace, sets, True, timer)
    fla = fla_step(m)
    if fla is not None:
        _timed(row, "fla", fla, sets, False, timer)
    for cfg in cands:
        if cfg.window and T == 1:
            continue
        fn = (lambda x, cfg=cfg: L.step_triton(x["q"], x["k"], x["v"], x["g"], x["beta"], x["state"],
                                                x["scale"], True, inplace=True, config=cfg)[0])
        _timed(row, config_label(cfg), fn, sets, True, timer)
    if bandwidth:
        row["floor_us"] = bytes_moved(m, B, T) / bandwidth * 1e6
    timed = {k[:-3]: v for k, v in row.items() if k.endswith("_us") and k[:-3] in map(config_label, cands)}
    row["best"] = min(timed, key=timed.get) if timed else ""
    return add_ratios(row, (("kda_over_floor", "kda_us", "floor_us"), ("kda_over_fla", "kda_us", "fla_us"),
                            ("best_over_floor", f"{row['best']}_us", "floor_us")))


def table_row_info(model: str, m: Model, B: int, T: int) -> dict:
    cfg = L.launch_config(B, m.v_heads, m.k_dim, m.v_dim, T)
    measured = L.table_row(B * m.v_heads, T).measured
    return {"model": model, "B": B, "T": T, "table": config_label(cfg), "class": measured or "provisional"}


def run_verify(args, device, timer, bandwidth, deadline) -> list[dict]:
    """``--verify``: T = 1, 2, 4, 8 at B = 1, 32, 128 for GDN (Qwen3-Next) and KDA (Kimi Linear): the
    op, FLA and the floor, with each ``--candidates`` launch of the kernel beside them."""
    t0 = time.perf_counter()
    cands = [parse_config(c) for c in (args.candidates or CANDIDATES).split(",") if c.strip()]
    cases = [("qwen3_next", 1, 2), ("kimi_linear", 2, 2)] if args.smoke else VERIFY_CASES
    rows = []
    for model, B, T in cases:
        if time.perf_counter() > deadline:
            print(f"verify: time budget spent before {model} B={B} T={T}", flush=True)
            break
        rows.append(verify_case(model, B, T, cands, smoke=args.smoke, device=device, timer=timer,
                                bandwidth=bandwidth))
        progress(rows[-1])
    labels = [config_label(c) for c in cands]
    cols = (("model", "model", "s"), ("B", "B", ","), ("T", "T", ","), ("table", "table", "s"),
            ("class", "class", "s"), ("kda_us", "kda us", ".2f"), ("fla_us", "FLA us", ".2f"),
            ("floor_us", "floor us", ".2f"), ("kda_over_floor", "kda/floor", ".2f"), ("kda_over_fla", "kda/FLA", ".3f"),
            *((f"{c}_us", c, ".2f") for c in labels), ("best", "best", "s"), ("best_over_floor", "best/floor", ".2f"),
            ("kda_spread", "kda spread %", ".1f"), ("check", "check", "s"))
    title = (f"verify window: CUDA-graph replay, {CALLS} calls a graph, each figure the mean of two timings; "
             f"{_versions()}; {time.perf_counter() - t0:.0f} s" if not args.smoke else "NOT meaningful (CPU smoke run)")
    print_table(rows, cols, title=title)
    print(title + "\n\n" + markdown_table(rows, cols), flush=True)
    if not args.smoke:
        write_out_json(f"bench_{NAME}_verify.json", {"env": environment_info(), "commit": git_commit(),
                                                      "versions": _versions(), "rows": rows})
    return rows


# --------------------------------------------------------------------------- report / main


def report_jobs(s) -> list:
    """``benchmarks/report.py``'s rows (``s``: its ``Settings``): Qwen3-Next's decode (T = 1) at 32
    and 128 sequences; the peer is FLA's ``fused_recurrent_gated_delta_rule``."""
    def job(B):
        m = (SMOKE_MODELS if s.smoke else MODELS)["qwen3_next"]
        timer = smoke_timer if s.smoke else (lambda fns: graph_replay_median_us(fns, reps=s.reps, inner=2) / CALLS)
        row = run_case("qwen3_next", m, B, 1, device=s.device, timer=timer, bandwidth=s.bandwidth, smoke=s.smoke)
        return s.ratios({**row, "rewrite": NAME, "shape": f"decode B={B} Hv={m.v_heads} K={m.k_dim}",
                         "peer_us": row.get("fla_us")})

    return [lambda B=B: job(B) for B in ((2,) if s.smoke else (32, 128))]


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], capture_output=True, text=True, cwd=_HERE, timeout=10)


def git_commit() -> str | None:
    """The commit of the code that runs: ``$KDA_GIT_COMMIT`` when set (a copied tree's ``.git``
    may be stale: the device's reported the session's first commit under newer files), else
    git's ``HEAD`` (short), ``-dirty`` when tracked files differ from it; None without git."""
    if os.environ.get("KDA_GIT_COMMIT"):
        return os.environ["KDA_GIT_COMMIT"].strip()
    try:
        head = _git("rev-parse", "--short", "HEAD").stdout.strip()
        return head + ("-dirty" if head and _git("diff", "--quiet", "HEAD", "--").returncode == 1 else "") or None
    except Exception:  # noqa: BLE001 - no git here
        return None


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
    return f"fla-core {fla}; transformers {tf}; commit {git_commit()}"


SWEEP_COLUMNS = (("model", "model", "s"), ("B", "B", ","), ("T", "T", ","), ("config", "config", "s"),
                 ("us", "us", ".2f"), ("floor_us", "floor us", ".2f"), ("over_floor", "/floor", ".2f"),
                 ("regs", "regs", ","), ("spills", "spills", ","), ("default", "default", "s"), ("best", "best", "s"))


def run_sweep(args, device, timer, bandwidth, deadline) -> list[dict]:
    t0 = time.perf_counter()
    configs = [parse_config(c) for c in args.candidates.split(",") if c.strip()] if args.candidates else None
    rows = sweep(device, timer, bandwidth, args.smoke, deadline, configs)
    _mark_best(rows)
    title = f"launch configs (columns per program, warps; scaled: the SCALED body); {_versions()}; " \
            f"{time.perf_counter() - t0:.0f} s"
    print_table(rows, SWEEP_COLUMNS, title=title)
    print(title + "\n\n" + markdown_table(rows, SWEEP_COLUMNS), flush=True)
    if not args.smoke:
        write_out_json(f"bench_{NAME}_sweep.json", {"env": environment_info(), "commit": git_commit(),
                                                     "versions": _versions(), "rows": rows})
    return rows


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="the targets' cases only (12)")
    p.add_argument("--models", default=None, help=f"of {sorted(MODELS)}, comma-separated")
    p.add_argument("--B", default=None, help="batches, comma-separated (default: the plan's)")
    p.add_argument("--T", default=None, help="tokens per sequence, comma-separated (default: the plan's)")
    p.add_argument("--no-stock", action="store_true", help="skip stock torch.compile (the compiles take most of a run)")
    p.add_argument("--no-eager", action="store_true", help="skip eager (slow at large B x T)")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--sweep", action="store_true", help="time the kernel's launch configs instead")
    p.add_argument("--verify", action="store_true",
                   help="the verify window: T 1 / 2 / 4 / 8 x B 1 / 32 / 128, GDN and KDA, op / FLA / floor (~3 min)")
    p.add_argument("--candidates", default=None,
                   help="with --verify: launches of the kernel timed beside the op (seq16w1, win32w4, pst16w1x8s2, "
                        f"...; default {CANDIDATES}); with --sweep: the launches swept (default SWEEP_CONFIGS)")
    p.add_argument("--budget", type=float, default=480, help="seconds after which no new case starts")
    p.add_argument("--no-record", action="store_true")
    p.add_argument("--smoke", action="store_true", help="tiny CPU run: checks only")
    args = p.parse_args(argv)
    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (use --smoke on CPU)")
    t0 = time.perf_counter()
    deadline = t0 + args.budget
    timer = smoke_timer if args.smoke else gpu_timer(args.reps)
    bandwidth = None if args.smoke else measure_copy_bandwidth(device)
    if args.sweep:
        return run_sweep(args, device, timer, bandwidth, deadline)
    if args.verify:
        return run_verify(args, device, timer, bandwidth, deadline)
    rows = []
    keep = [None if v is None else v.split(",") for v in (args.models, args.B, args.T)]
    cases = [c for c in plan(args.quick, args.smoke)
             if all(k is None or str(x) in k for k, x in zip(keep, c))]
    for model, B, T in cases:
        if time.perf_counter() > deadline:
            print(f"time budget of {args.budget:.0f} s spent: {len(cases) - len(rows)} later cases not run", flush=True)
            break
        m = (SMOKE_MODELS if args.smoke else MODELS)[model]
        try:
            rows.append(run_case(model, m, B, T, device=device, timer=timer, bandwidth=bandwidth, smoke=args.smoke,
                                 stock=not args.no_stock, eager=not args.no_eager))
        except Exception as e:  # noqa: BLE001 - one failing case must not lose the others
            traceback.print_exc()
            rows.append({"model": model, "B": B, "T": T, "note": f"{type(e).__name__}: {e}"[:200]})
        progress(rows[-1])
    notes = ("NOT meaningful (CPU smoke run)" if args.smoke else
             f"CUDA-graph replay medians, {CALLS} calls per graph, each variant timed twice (mean; spread = their "
             f"largest relative difference); copy bandwidth {bandwidth / 1e12:.2f} TB/s; {_versions()}")
    finish(NAME, rows, COLUMNS, notes, smoke=args.smoke, record=not args.no_record, results_dir=_HERE / "results",
           started=t0)
    print(markdown_table(rows, COLUMNS), flush=True)  # the same table, unclipped in a narrow log
    return rows


if __name__ == "__main__":
    main()
