"""``causal_conv1d`` on a GPU: transformers' depthwise causal conv + silu (the torch fallback every
GDN / KDA family runs without the causal-conv1d package) at the real models' widths, prefill
(1 x T tokens, T 1 .. 16384) and decode (32 / 128 sequences, one token, the conv state in place):
eager, stock ``torch.compile``, kda_inductor with the default rules and forced, FLA's Triton
``causal_conv1d`` / ``causal_conv1d_update`` where ``fla-core`` is importable, and the floor
(bytes read and written over the measured copy bandwidth). CUDA-graph replay medians; every
compiled variant is first checked against eager (kda must be bit-exact; the ``exact`` column).

    python benchmarks/bench_causal_conv1d.py                  # prefill (T dynamic) + decode, all widths (~5-8 min)
    python benchmarks/bench_causal_conv1d.py --widths qwen3_next --T 1,16,256,4096,16384   # the quick look
    python benchmarks/bench_causal_conv1d.py --static         # prefill compiled per T (static sizes)
    python benchmarks/bench_causal_conv1d.py --sweep          # the kernel's launch configs (tune launch_config)
    python benchmarks/bench_causal_conv1d.py --smoke          # CPU, tiny, checks only

Widths (``conv_dim``, K = 4): Qwen3-Next / Qwen3.5 8192 (2 x 16 x 128 + 32 x 128), Kimi Linear and
Bailing in transformers 12288 (one conv over q | k | v), Kimi in vLLM / FLA 4096 (one conv per
projection), OLMo-hybrid 11520 (2 x 30 x 96 + 30 x 192), Lara-mini 4096. Forms: ``proj`` (the conv
reads a projection's ``[1, T, C]`` output, Qwen3.5), ``cat`` (Qwen3-Next: ``cat(q, k, v)`` of views
of the ``qkvz`` projection, the cat included in every variant). Each variant returns the conv's
result token-major and contiguous (what the layer's split and its consumers read).

Widths run one at a time (prefill, then decode); no new case starts after ``--budget`` seconds
(450), and the rows done are recorded. The run ends with the speed rule's input: per width and form, the smallest T from which kda
(forced) is faster than stock at that T and every larger one (``CUDA_MIN_TOKENS`` in
``kda_inductor/patterns/causal_conv1d.py``; 1 when it never loses). Results:
``benchmarks/results/causal_conv1d.{md,json}``.
"""

from __future__ import annotations

import argparse
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
    measure_copy_bandwidth,
    perf_counter_median_us,
    print_table,
    progress,
    write_out_json,
)

NAME = "causal_conv1d"
K = 4
T_VALUES = (1, 2, 4, 16, 64, 256, 1024, 4096, 16384)
DECODE_BATCHES = (32, 128)
WIDTHS = {"qwen3_next": 8192, "kimi_hf": 12288, "olmo_hybrid": 11520, "kimi_vllm": 4096}
"""In the order they run (a spent ``--budget`` drops the last)."""
COLUMNS = (("case", "case", "s"), ("T", "T", ","), ("B", "B", ","), ("C", "C", ","), ("eager_us", "eager us", ".2f"),
           ("stock_us", "stock us", ".2f"), ("kda_us", "kda us", ".2f"), ("forced_us", "kda forced us", ".2f"),
           ("fla_us", "FLA us", ".2f"), ("floor_us", "floor us", ".2f"), ("kda_over_stock", "forced/stock", ".3f"),
           ("kda_over_floor", "forced/floor", ".2f"), ("exact", "exact", "s"), ("note", "note", "s"))


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
            q, k, v, _ = torch.split(x, [128, 128, 256, 256], dim=3)
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
        return torch.randn(1, T, 16, 768, generator=g).to(torch.bfloat16).to(device)
    return torch.randn(B, T, C, generator=g).to(torch.bfloat16).to(device)


def bytes_moved(T: int, B: int, C: int, decode: bool) -> int:
    """x read and y written (bf16), the weight, and in decode the state read and written."""
    return 2 * (2 * B * T * C + C * K + (2 * B * C * K if decode else 0))


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


def fla_variant(module, decode: bool):
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


def run(case: str, T: int, B: int, C: int, *, device, timer, bandwidth, fns=None, module=None) -> dict:
    decode = case.startswith("decode")
    if module is None:
        module = Decode(B, C, device) if decode else Prefill(C, case.split(":")[1], device)
    fns = fns or variants(module, dynamic_T=False)
    x = _input(case, T, B, C, device)
    start = module.state.clone() if decode else None
    reset = (lambda: module.state.copy_(start)) if decode else (lambda: None)
    reset()
    with torch.inference_mode():
        want = module(x)
    row = {"case": case, "T": T, "B": B, "C": C, "note": ""}
    exact, made = {}, {}
    for name in ("stock", "kda", "forced"):
        exact[name], made[name] = _check(fns[name], x, want, reset)
    fla = fla_variant(module, decode)
    if fla is not None:
        exact["fla"], _ = _check(fla, x, want, reset)
        fns = {**fns, "fla": fla}
    row["exact"] = f"kda {exact['forced']}, stock {exact['stock']}" + (f", fla {exact['fla']}" if "fla" in exact else "")
    if made["kda"] is not None:
        row["note"] = f"default rules: {made['kda']} rewrite(s)"
    for name, fn in fns.items():
        key = f"{name}_us"
        try:
            with torch.inference_mode():
                row[key] = timer(lambda fn=fn: fn(x))
        except Exception as e:  # noqa: BLE001
            row[key], row["note"] = None, (row["note"] + f" {name}: {type(e).__name__}")[:200]
    if bandwidth:
        row["floor_us"] = bytes_moved(T, B, C, decode) / bandwidth * 1e6
    return add_ratios(row, (("kda_over_stock", "forced_us", "stock_us"), ("kda_over_floor", "forced_us", "floor_us")))


# --------------------------------------------------------------------------- the rule's input


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


def sweep(device, timer, bandwidth, smoke: bool = False) -> list[dict]:
    """The kernel alone (``conv_triton``) over launch configs at Qwen3-Next's width."""
    from kda_inductor.lowerings import causal_conv1d as L

    rows, C = [], 64 if smoke else WIDTHS["qwen3_next"]
    w = 0.3 * torch.randn(C, K, device=device, dtype=torch.bfloat16)
    shapes = [(1, 2), (16, 1)] if smoke else [(1, 32), (1, 128), (256, 1), (4096, 1), (16384, 1)]
    for T, B in shapes:
        x = torch.randn(B, T, C, device=device, dtype=torch.bfloat16).transpose(1, 2)
        state = torch.randn(B, C, K, device=device, dtype=torch.bfloat16) if T == 1 else None
        for bt in sorted(({8} if smoke else {1, 8, 16, 32, 64}) if T > 1 else {1}):
            for bc in ((32,) if smoke else (32, 64, 128, 256, 512)):
                for nw in ((1,) if smoke else (1, 2, 4, 8)):
                    cfg = L.LaunchConfig(bt, bc, nw)
                    try:
                        us = timer(lambda: L.conv_triton(x, w, None, state, update=state is not None, config=cfg))
                    except Exception as e:  # noqa: BLE001
                        us = None
                        print(f"sweep {T}x{B} {cfg}: {type(e).__name__}: {e}", flush=True)
                    rows.append({"T": T, "B": B, "config": f"{bt}x{bc} w{nw}", "us": us,
                                 "default": "yes" if cfg == L.launch_config(T, C, B, update=state is not None) else "",
                                 "floor_us": bytes_moved(T, B, C, T == 1) / bandwidth * 1e6 if bandwidth else None})
    return rows


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
        rows.append({**run(case, T, B, C, **kw), "case": f"{label} {case.split(':')[-1]}"})
        progress(rows[-1])
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        rows.append({"case": f"{label} {case.split(':')[-1]}", "T": T, "B": B, "C": C, "note": type(e).__name__})


def _width_rows(args, label: str, C: int, t_values, batches, deadline: float, **kw) -> list[dict]:
    """One width: its prefill forms over T (one compile for every T unless ``--static``), then
    its decode batches; nothing new starts past ``deadline`` (the rows so far are recorded)."""
    rows: list[dict] = []
    for form in (("proj", "cat") if label == "qwen3_next" and not args.smoke else ("proj",)):
        torch._dynamo.reset()
        module = Prefill(C, form, kw["device"])
        fns = None if args.static else variants(module, dynamic_T=True)
        for T in t_values:
            if time.perf_counter() > deadline:
                return rows
            if args.static:
                torch._dynamo.reset()
            _row(rows, label, f"prefill:{form}", T, 1, C, fns=fns, module=module, **kw)
    for B in batches:
        if time.perf_counter() > deadline:
            return rows
        torch._dynamo.reset()
        _row(rows, label, "decode", 1, B, C, **kw)
    return rows


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--T", default=None, help="prefill token counts, comma-separated")
    p.add_argument("--widths", default=None, help=f"of {sorted(WIDTHS)}, comma-separated")
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--static", action="store_true", help="prefill compiled per T (default: T dynamic)")
    p.add_argument("--sweep", action="store_true", help="time the kernel's launch configs instead")
    p.add_argument("--budget", type=float, default=450, help="seconds after which no new case starts")
    p.add_argument("--no-record", action="store_true")
    p.add_argument("--smoke", action="store_true", help="tiny CPU run: checks only")
    args = p.parse_args(argv)
    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (use --smoke on CPU)")
    timer = ((lambda fn: perf_counter_median_us(fn, 1)) if args.smoke
             else (lambda fn: graph_replay_median_us(fn, reps=args.reps, inner=5, calls=10)))
    bandwidth = None if args.smoke else measure_copy_bandwidth(device)
    torch._inductor.config.force_disable_caches = True
    t0 = time.perf_counter()
    if args.sweep:
        rows = sweep(device, timer, bandwidth, args.smoke)
        for key in {(r["T"], r["B"]) for r in rows}:
            mine = [r for r in rows if (r["T"], r["B"]) == key and r["us"] is not None]
            for r in mine:
                r["best"] = "best" if r is min(mine, key=lambda r: r["us"]) else ""
        print_table(rows, (("T", "T", ","), ("B", "B", ","), ("config", "config", "s"), ("us", "us", ".2f"),
                           ("floor_us", "floor us", ".2f"), ("default", "default", "s"), ("best", "best", "s")),
                    title="launch configs (tokens x channels per program, warps)")
        if not args.smoke:
            write_out_json(f"bench_{NAME}_sweep.json", {"env": environment_info(), "rows": rows})
        return rows
    t_values = (tuple(int(v) for v in args.T.split(",")) if args.T else (1, 5, 16) if args.smoke else T_VALUES)
    names = args.widths.split(",") if args.widths else list(WIDTHS)
    widths = {"smoke": 64} if args.smoke else {n: WIDTHS[n] for n in names}
    deadline, rows = t0 + args.budget, []
    for label, C in widths.items():
        rows += _width_rows(args, label, C, t_values, (2,) if args.smoke else DECODE_BATCHES, deadline,
                            device=device, timer=timer, bandwidth=bandwidth)
    if time.perf_counter() > deadline:
        print(f"time budget of {args.budget:.0f} s spent: later cases not run", flush=True)
    rule = crossover(rows)
    notes = ("NOT meaningful (CPU smoke run)" if args.smoke else
             f"CUDA-graph replay medians, 10 calls per graph; copy bandwidth {bandwidth / 1e12:.2f} TB/s; bf16, K=4, "
             f"prefill T {'static' if args.static else 'dynamic'}; crossover: "
             + "; ".join(f"{r['case']} from {r['min_tokens']}" for r in rule))
    finish(NAME, rows, COLUMNS, notes, smoke=args.smoke, record=not args.no_record, results_dir=_HERE / "results",
           started=t0)
    print_table(rule, (("case", "case", "s"), ("min_tokens", "kda faster from B*T", "s"),
                       ("worst", "worst forced/stock", ".3f")), title="speed rule input (CUDA_MIN_TOKENS)")
    return rows


if __name__ == "__main__":
    main()
