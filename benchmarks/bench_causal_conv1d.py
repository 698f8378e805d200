"""``causal_conv1d`` on a GPU: transformers' depthwise causal conv + silu (the torch fallback every
GDN / KDA family runs without the causal-conv1d package) at the real models' widths, prefill
(1 x T tokens, T 1 .. 16384), Qwen3-Next's ``cat(q, k, v)`` form, varlen prefill (``cu_seqlens``)
and decode (32 / 128 sequences, one token, the conv state in place): eager, stock
``torch.compile``, kda_inductor with the default rules and forced, the kda op called directly
(``op``: ``kda::causal_conv1d``, ``_cat`` on the q / k / v views, ``_update``; what the kernel
costs before a pattern is wired), FLA's Triton ``causal_conv1d`` / ``causal_conv1d_update``
where ``fla-core`` is importable, and the floor (bytes read and written over the measured copy
bandwidth). CUDA-graph replay medians, 10 calls per graph; every variant is timed in two rounds
(all variants, then all again): the op's and FLA's two numbers are shown, ``spread`` is the
largest difference between a variant's two rounds. Every compiled variant is first checked
against eager (kda must be bit-exact; the ``exact`` column).

    python benchmarks/bench_causal_conv1d.py --budget 230     # every width, as far as 230 s go
    python benchmarks/bench_causal_conv1d.py --widths qwen3_next --forms proj,cat --T 1,256,1024,4096,16384
    python benchmarks/bench_causal_conv1d.py --static         # prefill compiled per T (static sizes)
    python benchmarks/bench_causal_conv1d.py --quick          # the quick check, < 4 minutes (below)
    python benchmarks/bench_causal_conv1d.py --smoke          # CPU, tiny, checks only

Widths (``conv_dim``, K = 4): Qwen3-Next / Qwen3.5 8192 (2 x 16 x 128 + 32 x 128), Kimi Linear and
Bailing in transformers 12288 (one conv over q | k | v), Kimi in vLLM / FLA 4096 (one conv per
projection), OLMo-hybrid 11520 (2 x 30 x 96 + 30 x 192), Lara-mini 4096. Forms: ``proj`` (the conv
reads a projection's ``[1, T, C]`` output, Qwen3.5), ``cat`` (Qwen3-Next: ``cat(q, k, v)`` of views
of the ``qkvz`` projection, the cat included in every compiled variant; ``op`` reads the views),
``varlen`` (the op and FLA only: ``VARLEN_SEQS`` sequences of random lengths in T tokens).

Cases run one width at a time; no new case starts after ``--budget`` seconds (450) and the rows
done are recorded. The run ends with the targets (op against the floor and FLA, decode against FLA) and
the speed rule's input: per width and form, the smallest T from which kda (forced) is faster
than stock at that T and every larger one (``CUDA_MIN_TOKENS`` in
``kda_inductor/patterns/causal_conv1d.py``; 1 when it never loses). ``kda`` is the rewrite
inside the compiled layer ("in the step"); ``kda/op`` its time over the op's alone. ``--quick``:
Qwen3-Next's width, prefill T 4096 and 16384 (eager, stock, kda, the op, FLA, the floor) and
decode 32 / 128, 20 repetitions, a 200 s budget. The kernels' launch configs are swept by
``benchmarks/tune_causal_conv1d.py``. Results: ``benchmarks/results/causal_conv1d.{md,json}``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE), str(_HERE.parent)]
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
    record_results,
    write_out_json,
)

NAME = "causal_conv1d"
K = 4
T_VALUES = (1, 2, 4, 16, 64, 256, 1024, 4096, 16384)
DECODE_BATCHES = (32, 128)
VARLEN_T = (1024, 4096)
VARLEN_SEQS = 16
WIDTHS = {"qwen3_next": 8192, "kimi_hf": 12288, "olmo_hybrid": 11520, "kimi_vllm": 4096}
"""In the order they run (a spent ``--budget`` drops the last)."""
ROUNDS = 2
"""Timing rounds per case: every variant, then every variant again (the spread shows the noise)."""
COLUMNS = (("case", "case", "s"), ("T", "T", ","), ("B", "B", ","), ("C", "C", ","), ("eager_us", "eager us", ".2f"),
           ("stock_us", "stock us", ".2f"), ("kda_us", "kda us", ".2f"), ("forced_us", "kda forced us", ".2f"),
           ("op_runs", "op us (2 rounds)", "s"), ("fla_runs", "FLA us (2 rounds)", "s"), ("floor_us", "floor us", ".2f"),
           ("op_over_floor", "op/floor", ".2f"), ("op_over_fla", "op/FLA", ".2f"), ("step_over_op", "kda/op", ".2f"),
           ("kda_over_stock", "forced/stock", ".3f"), ("spread", "spread", ".1%"), ("exact", "exact", "s"),
           ("note", "note", "s"))


# --------------------------------------------------------------------------- the code timed


def conv_fn(x, weight, bias=None, activation="silu"):
    """transformers' ``causal_conv1d_fn`` (``models/qwen3_next/modeling_qwen3_next.py``)."""
    seq_len, padding = x.shape[-1], weight.shape[-1] - 1
    out = F.conv1d(x.to(weight.dtype), weight=weight.unsqueeze(1), bias=bias, padding=padding,
                   groups=x.shape[1])[:, :, :seq_len]
    return F.silu(out).to(x.dtype) if activation else out.to(x.dtype)


def conv_update(x, conv_state, weight, bias=None, activation="silu"):
    """transformers' ``causal_conv1d_update``: the state shifted in place."""
    seq_len, state_len = x.shape[-1], conv_state.shape[-1]
    new = torch.cat([conv_state, x], dim=-1).to(weight.dtype)
    conv_state.copy_(new[:, :, -state_len:])
    out = F.conv1d(new, weight.unsqueeze(1), bias, padding=0, groups=x.shape[1])[:, :, -seq_len:]
    return (F.silu(out) if activation else out).to(x.dtype)


QKVZ_SPLIT = (128, 128, 256, 256)
"""Qwen3-Next's ``qkvz [1, T, 16, 768]`` split into q, k (16 x 128), v (16 x 256) and z."""


class Prefill(torch.nn.Module):
    """The layer around the prefill conv: ``x [1, T, C]`` (or Qwen3-Next's ``cat`` of the q / k /
    v views of ``qkvz [1, T, 16, 768]``) -> conv + silu -> token-major ``[1, T, C]``."""

    def __init__(self, C: int, form: str, device):
        super().__init__()
        self.form = form
        self.weight = torch.nn.Parameter(0.3 * torch.randn(C, K, device=device, dtype=torch.bfloat16),
                                         requires_grad=False)

    def forward(self, x):
        if self.form == "cat":  # q, k [1, T, 16, 128], v [1, T, 16, 256] -> [1, T, 8192]
            q, k, v, _ = torch.split(x, list(QKVZ_SPLIT), dim=3)
            x = torch.cat([t.reshape(t.shape[0], t.shape[1], -1) for t in (q, k, v)], dim=-1)
        return conv_fn(x.transpose(1, 2), self.weight).transpose(1, 2).contiguous()


class Decode(torch.nn.Module):
    """One decode step's conv: ``x [B, 1, C]``, the state ``[B, C, K]`` a buffer (a static
    address, as transformers' cache keeps it), updated in place."""

    def __init__(self, B: int, C: int, device):
        super().__init__()
        self.weight = torch.nn.Parameter(0.3 * torch.randn(C, K, device=device, dtype=torch.bfloat16),
                                         requires_grad=False)
        self.register_buffer("state", torch.randn(B, C, K, device=device, dtype=torch.bfloat16))

    def forward(self, x):
        return conv_update(x.transpose(1, 2), self.state, self.weight).transpose(1, 2).contiguous()


def _input(case: str, T: int, B: int, C: int, device):
    g = torch.Generator().manual_seed(T * 7 + B)
    if case.endswith(":cat"):
        return torch.randn(1, T, 16, sum(QKVZ_SPLIT), generator=g).to(torch.bfloat16).to(device)
    return torch.randn(B, T, C, generator=g).to(torch.bfloat16).to(device)


def bytes_moved(T: int, B: int, C: int, decode: bool) -> int:
    """x read and y written (bf16), the weight, and in decode the state read and written."""
    return 2 * (2 * B * T * C + C * K + (2 * B * C * K if decode else 0))


def varlen_cu(T: int, n: int, device) -> torch.Tensor:
    """``cu_seqlens`` of ``n`` sequences of random lengths (at least 1) summing to ``T``."""
    g = torch.Generator().manual_seed(T + n)
    cuts = torch.randperm(T - 1, generator=g)[:n - 1].sort().values + 1
    return torch.cat([torch.zeros(1, dtype=torch.int64), cuts, torch.full((1,), T)]).to(torch.int32).to(device)


# --------------------------------------------------------------------------- variants


def _compiled(module, backend: str, options=None, dynamic_T: bool = False):
    """Static sizes, or (``dynamic_T``) Dynamo's automatic dynamic shapes: the second token count
    recompiles with T symbolic, as a prefill of varying prompt lengths does."""
    return torch.compile(module, backend=backend, options=options, dynamic=None if dynamic_T else False)


def variants(module, dynamic_T: bool):
    """name -> callable(x): eager, stock, kda (default rules), kda forced."""
    return {"eager": module,
            "stock": _compiled(module, "inductor", dynamic_T=dynamic_T),
            "kda": _compiled(module, "kda_inductor", dynamic_T=dynamic_T),
            "forced": _compiled(module, "kda_inductor", {"kda": {"force": True}}, dynamic_T=dynamic_T)}


def op_variant(module, decode: bool):
    """The kda op itself on the layer's tensors (the cat form: ``causal_conv1d_cat`` on the q / k /
    v views, no cat), returning the layer's token-major result."""
    import kda_inductor.lowerings.causal_conv1d  # noqa: F401  (registers the ops)

    ops, w, bf = torch.ops.kda, module.weight, torch.bfloat16
    if decode:
        return lambda x: ops.causal_conv1d_update(x.transpose(1, 2), module.state, w, None, "silu", bf, bf
                                                  ).transpose(1, 2)
    if getattr(module, "form", "proj") == "cat":
        return lambda x: ops.causal_conv1d_cat(list(torch.split(x, list(QKVZ_SPLIT), dim=3)[:3]), w, None, None,
                                               None, "silu", bf, bf).transpose(1, 2)
    return lambda x: ops.causal_conv1d(x.transpose(1, 2), w, None, None, None, "silu", bf, bf).transpose(1, 2)


def fla_variant(module, decode: bool, cu_seqlens=None):
    """FLA's Triton conv on the same tensors (None where fla-core is not importable)."""
    try:
        from fla.modules.causal_conv1d import causal_conv1d, causal_conv1d_update
    except Exception:  # noqa: BLE001 - not installed, or its import fails on this machine
        return None
    w = module.weight
    if decode:
        return lambda x: causal_conv1d_update(x, module.state, weight=w, activation="silu")[0]
    if getattr(module, "form", "proj") == "cat":
        return None  # FLA reads a [B, T, D] tensor: the cat would be a separate copy
    if cu_seqlens is not None:
        return lambda x: causal_conv1d(x, weight=w, activation="silu", cu_seqlens=cu_seqlens)[0]
    return lambda x: causal_conv1d(x, weight=w, activation="silu")[0]


def _check(fn, x, want, reset) -> tuple[str, int | None]:
    """``('yes', rewrites)`` where ``fn(x)`` is bit-exact with eager (``'no (max err)'`` where
    not, the error where it raised); ``rewrites``: causal_conv1d matches made if this call
    compiled (None if it did not). The module's state is reset first."""
    from kda_inductor import pass_manager

    try:
        reset()
        with pass_manager.observe() as records, torch.inference_mode():
            got = fn(x)
        n = sum(r.matches.get(NAME, 0) for r in records) if records else None
        if torch.equal(got, want):
            return "yes", n
        return f"no ({(got.float() - want.float()).abs().max().item():.3g})", n
    except Exception as e:  # noqa: BLE001 - a failing variant prints and the others go on
        traceback.print_exc()
        return f"{type(e).__name__}: {e}"[:120], None


# --------------------------------------------------------------------------- one row


def time_rounds(fns: dict, x, timer, row: dict) -> None:
    """Every variant timed in ``ROUNDS`` rounds (all variants, then all again): ``<name>_us`` the
    median of its rounds, ``<name>_runs`` the rounds as text, ``spread`` the largest relative
    difference between a variant's rounds."""
    runs: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(ROUNDS):
        for name, fn in fns.items():
            try:
                with torch.inference_mode():
                    runs[name].append(timer(lambda fn=fn: fn(x)))
            except Exception as e:  # noqa: BLE001
                row["note"] = (row["note"] + f" {name}: {type(e).__name__}")[:200]
    spread = 0.0
    for name, us in runs.items():
        row[f"{name}_us"] = statistics.median(us) if us else None
        row[f"{name}_runs"] = " / ".join(f"{u:.2f}" for u in us) if us else None
        if len(us) > 1:
            spread = max(spread, max(us) / min(us) - 1)
    row["spread"] = spread


def _exactness(fns: dict, x, want, reset) -> tuple[str, dict]:
    exact, made = {}, {}
    for name in fns:
        if name != "eager":
            exact[name], made[name] = _check(fns[name], x, want, reset)
    text = ", ".join(f"{'kda' if n == 'forced' else n} {exact[n]}" for n in ("forced", "op", "stock", "fla")
                     if n in exact)
    return text, made


def run(case: str, T: int, B: int, C: int, *, device, timer, bandwidth, fns=None, module=None) -> dict:
    decode = case.startswith("decode")
    if module is None:
        module = Decode(B, C, device) if decode else Prefill(C, case.split(":")[1], device)
    fns = dict(fns or variants(module, dynamic_T=False))
    fns["op"] = op_variant(module, decode)
    fla = fla_variant(module, decode)
    if fla is not None:
        fns["fla"] = fla
    x = _input(case, T, B, C, device)
    start = module.state.clone() if decode else None
    reset = (lambda: module.state.copy_(start)) if decode else (lambda: None)
    reset()
    with torch.inference_mode():
        want = module(x)
    row = {"case": case, "T": T, "B": B, "C": C, "note": ""}
    row["exact"], made = _exactness(fns, x, want, reset)
    if made.get("kda") is not None:
        row["note"] = f"default rules: {made['kda']} rewrite(s)"
    time_rounds(fns, x, timer, row)
    if bandwidth:
        row["floor_us"] = bytes_moved(T, B, C, decode) / bandwidth * 1e6
    return add_ratios(row, (("kda_over_stock", "forced_us", "stock_us"), ("op_over_floor", "op_us", "floor_us"),
                            ("op_over_fla", "op_us", "fla_us"), ("step_over_op", "kda_us", "op_us")))


def run_varlen(T: int, C: int, *, device, timer, bandwidth) -> dict:
    """Varlen prefill (``VARLEN_SEQS`` sequences in T tokens): the op against eager's per-sequence
    conv (bit-exact) and FLA's varlen conv, timed."""
    from kda_inductor.lowerings import causal_conv1d as L

    module = Prefill(C, "proj", device)
    cu = varlen_cu(T, VARLEN_SEQS, device)
    x = _input("varlen", T, 1, C, device)
    bf = torch.bfloat16
    want = L.conv_cpu(x.transpose(1, 2), module.weight, None, None, cu, "silu", bf, bf,
                       L.validate(x.transpose(1, 2), module.weight, None, None, cu)).transpose(1, 2)
    fns = {"op": lambda x: torch.ops.kda.causal_conv1d(x.transpose(1, 2), module.weight, None, None, cu, "silu",
                                                       bf, bf).transpose(1, 2)}
    fla = fla_variant(module, False, cu_seqlens=cu.long())
    if fla is not None:
        fns["fla"] = fla
    row = {"case": "varlen", "T": T, "B": VARLEN_SEQS, "C": C, "note": f"{VARLEN_SEQS} sequences"}
    row["exact"], _ = _exactness(fns, x, want, lambda: None)
    time_rounds(fns, x, timer, row)
    if bandwidth:
        row["floor_us"] = bytes_moved(T, 1, C, False) / bandwidth * 1e6
    return add_ratios(row, (("op_over_floor", "op_us", "floor_us"), ("op_over_fla", "op_us", "fla_us")))


# --------------------------------------------------------------------------- the rule's input, the targets


def crossover(rows: list[dict]) -> list[dict]:
    """Per case: the smallest T from which forced kda beats stock at every larger T measured."""
    out = []
    for case in dict.fromkeys(r["case"] for r in rows):
        mine = sorted((r for r in rows if r["case"] == case and r.get("forced_us") and r.get("stock_us")),
                      key=lambda r: (r["T"], r["B"]))
        first = None
        for r in reversed(mine):
            if r["forced_us"] < r["stock_us"]:
                first = r["T"] * r["B"]
            else:
                break
        out.append({"case": case, "min_tokens": str(first) if first is not None else "never",
                    "worst": max((r["forced_us"] / r["stock_us"] for r in mine), default=None)})
    return out


def targets(rows: list[dict]) -> list[dict]:
    """The kernel's targets, per row where they apply: projection form op <= 1.5x the floor at
    T >= 4096 and faster than FLA at T >= 256; the cat form's op <= 2x the floor; decode faster
    than FLA at B = 32 and 128."""
    out = []
    for r in rows:
        form = r["case"].split(" ")[-1]
        checks = []
        if form == "proj" and r["T"] >= 4096 and r.get("op_over_floor"):
            checks.append(("op <= 1.5 floor", r["op_over_floor"] <= 1.5))
        if form in ("proj", "varlen") and r["T"] >= 256 and r.get("op_over_fla"):
            checks.append(("op < FLA", r["op_over_fla"] < 1.0))
        if form == "cat" and r["T"] >= 256 and r.get("op_over_floor"):
            checks.append(("op <= 2 floor", r["op_over_floor"] <= 2.0))
        if form == "decode" and r["B"] in DECODE_BATCHES and r.get("op_over_fla"):
            checks.append(("op < FLA", r["op_over_fla"] < 1.0))
        for what, ok in checks:
            out.append({"case": r["case"], "T": r["T"], "B": r["B"], "target": what, "met": "yes" if ok else "NO",
                        "op_us": r.get("op_us"), "runs": r.get("op_runs")})
    return out


# --------------------------------------------------------------------------- report / main


def _report_row(s, case: str, T: int, B: int, C: int) -> dict:
    row = run(case, T, B, C, device=s.device, timer=s.timer, bandwidth=s.bandwidth)
    return {"rewrite": NAME, "shape": f"{case.split(':')[0]} C={C}" + (f" B={B}" if B > 1 else ""),
            **row, "peer_us": row.get("fla_us")}


def report_jobs(s) -> list:
    """``benchmarks/report.py``'s rows: the Qwen3-Next-width prefill at its sizes (static T) and
    the 32-sequence decode (``s``: its ``Settings``); the peer is FLA's Triton conv."""
    C = 64 if s.smoke else WIDTHS["qwen3_next"]
    jobs = [lambda T=T: _report_row(s, "prefill:proj", T, 1, C) for T in s.sizes]
    return jobs + [lambda: _report_row(s, "decode", 1, 2 if s.smoke else 32, C)]


def _row(rows: list[dict], label: str, case: str, T: int, B: int, C: int, **kw) -> None:
    """One row appended (a failure printed and recorded as the row's note: the others go on)."""
    try:
        made = run_varlen(T, C, **kw) if case == "varlen" else run(case, T, B, C, **kw)
        rows.append({**made, "case": f"{label} {case.split(':')[-1]}"})
        progress(rows[-1])
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        rows.append({"case": f"{label} {case.split(':')[-1]}", "T": T, "B": B, "C": C, "note": type(e).__name__})


def _width_rows(args, label: str, C: int, t_values, batches, deadline: float, **kw) -> list[dict]:
    """One width: its prefill forms over T (one compile for every T unless ``--static``), its
    decode batches, its varlen prefills; nothing new starts past ``deadline``."""
    rows: list[dict] = []
    forms = args.forms.split(",")
    prefill = [f for f in ("proj", "cat") if f in forms and (f == "proj" or label == "qwen3_next" and not args.smoke)]
    for form in prefill:
        torch._dynamo.reset()
        module = Prefill(C, form, kw["device"])
        fns = None if args.static else variants(module, dynamic_T=True)
        for T in t_values:
            if time.perf_counter() > deadline:
                return rows
            if args.static:
                torch._dynamo.reset()
            _row(rows, label, f"prefill:{form}", T, 1, C, fns=fns, module=module, **kw)
    for B in batches if "decode" in forms else ():
        if time.perf_counter() > deadline:
            return rows
        torch._dynamo.reset()
        _row(rows, label, "decode", 1, B, C, **kw)
    for T in (() if args.smoke or "varlen" not in forms else VARLEN_T):
        if time.perf_counter() <= deadline:
            _row(rows, label, "varlen", T, 1, C, **kw)
    return rows


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--T", default=None, help="prefill token counts, comma-separated")
    p.add_argument("--widths", default=None, help=f"of {sorted(WIDTHS)}, comma-separated")
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--static", action="store_true", help="prefill compiled per T (default: T dynamic)")
    p.add_argument("--forms", default="proj,cat,decode,varlen", help="the rows to run per width (cat: qwen3_next)")
    p.add_argument("--quick", action="store_true",
                   help="the quick check, under 4 minutes: Qwen3-Next's width, prefill (proj) T 4096 / 16384 "
                        "(op, FLA, stock, the compiled layer, the floor) and decode 32 / 128")
    p.add_argument("--budget", type=float, default=450, help="seconds after which no new case starts")
    p.add_argument("--no-record", action="store_true")
    p.add_argument("--smoke", action="store_true", help="tiny CPU run: checks only")
    args = p.parse_args(argv)
    if args.quick:
        args.widths, args.forms = args.widths or "qwen3_next", "proj,decode"
        args.T, args.reps, args.budget = args.T or "4096,16384", min(args.reps, 20), min(args.budget, 200)
    return args


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (use --smoke on CPU)")
    timer = ((lambda fn: perf_counter_median_us(fn, 1)) if args.smoke
             else (lambda fn: graph_replay_median_us(fn, reps=args.reps, inner=5, calls=10)))
    bandwidth = None if args.smoke else measure_copy_bandwidth(device)
    torch._inductor.config.force_disable_caches = True
    t0 = time.perf_counter()
    t_values = (tuple(int(v) for v in args.T.split(",")) if args.T else (1, 5, 16) if args.smoke else T_VALUES)
    names = args.widths.split(",") if args.widths else list(WIDTHS)
    widths = {"smoke": 64} if args.smoke else {n: WIDTHS[n] for n in names}
    deadline, rows = t0 + args.budget, []
    for label, C in widths.items():
        rows += _width_rows(args, label, C, t_values, (2,) if args.smoke else DECODE_BATCHES, deadline,
                            device=device, timer=timer, bandwidth=bandwidth)
    if time.perf_counter() > deadline:
        print(f"time budget of {args.budget:.0f} s spent: later cases not run", flush=True)
    report(args, rows, bandwidth, t0)
    return rows


def report(args, rows: list[dict], bandwidth, t0: float) -> None:
    """The table (recorded), the targets, the speed rule's input."""
    rule = crossover([r for r in rows if not r["case"].endswith("varlen")])
    notes = ("NOT meaningful (CPU smoke run)" if args.smoke else
             f"CUDA-graph replay medians, 10 calls per graph, {ROUNDS} rounds; copy bandwidth "
             f"{bandwidth / 1e12:.2f} TB/s; bf16, K=4, prefill T {'static' if args.static else 'dynamic'}; "
             "op = the kda op called directly; crossover: " + "; ".join(f"{r['case']} from {r['min_tokens']}"
                                                                      for r in rule))
    finish(NAME, rows, COLUMNS, notes, smoke=args.smoke, record=not args.no_record, results_dir=_HERE / "results",
           started=t0)
    print_table(targets(rows), (("case", "case", "s"), ("T", "T", ","), ("B", "B", ","), ("target", "target", "s"),
                                ("met", "met", "s"), ("op_us", "op us", ".2f"), ("runs", "2 rounds", "s")),
                title="targets: op <= 1.5x the floor and ahead of FLA (T >= 256), decode ahead of FLA")
    print_table(rule, (("case", "case", "s"), ("min_tokens", "kda faster from B*T", "s"),
                       ("worst", "worst forced/stock", ".3f")), title="speed rule input (CUDA_MIN_TOKENS)")


if __name__ == "__main__":
    main()
