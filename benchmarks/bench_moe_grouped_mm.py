"""GPU benchmark of ``kda::moe_grouped_mm`` (the op behind the ``moe_grouped_mm`` rewrite): a MoE layer's
grouped GEMM at decode sizes, against torch's own.

transformers' ``grouped_mm`` experts (the default on GPUs outside ``generate()``'s decoding, what
``benchmarks/hf_models.py``'s steps run) and the ``moe_grouped_experts`` rewrite call
``torch._grouped_mm(x, w, offs=offs)``: the (token, expert) pairs' rows sorted by expert times each
expert's weights. At decode a group is a few rows, so the weights' bytes are the work; torch's CUTLASS
kernel took 225.8 us of Qwen3-Next's 896-us decode-32 step (8 calls, 16 experts; H100, 19e7fc8,
``hf_models.json``'s kernel table) where reading the experts' weights once takes ~133.

Each case: Qwen3-Next's expert dims (hidden 2,048, expert intermediate 512: the gate-up projection K 2,048
x N 1,024 and the down projection K 512 x N 2,048, the weights stored ``[E, N, K]`` and passed
transposed as transformers does), bf16, 16 or 512 experts, each token's 10 distinct experts (top-k of
random scores). Columns: ``torch`` (``torch._grouped_mm``), ``kda`` (the op at :func:`launch_for`'s
launch), each ``--launches`` candidate, and the floor (the used experts' weights, ``x`` and the output
once, at the measured copy bandwidth). Every figure is a CUDA-graph replay median; each result is checked
against torch's on the rows the groups cover (bf16 rounding: the sums' order differs).

    python benchmarks/bench_moe_grouped_mm.py --budget 150    # 10 .. 40,960 pairs, 16 / 512 experts
    python benchmarks/bench_moe_grouped_mm.py --smoke         # CPU (interpreter): checks only

Its record (``benchmarks/results/moe_grouped_mm.md``) and the step's A / B set the rewrite's pair range
(``MEASURED`` in ``patterns/moe_grouped_mm.py``; ``docs/speed-rules.md``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE), str(_HERE.parent)]
from _timing import finish, graph_replay_median_us, measure_copy_bandwidth, perf_counter_median_us, progress  # noqa: E402

from kda_inductor.lowerings import moe_grouped_mm as L  # noqa: E402  (registers kda::moe_grouped_mm)

NAME = "moe_grouped_mm"
PROJECTIONS = {"gate_up": (2048, 1024), "down": (512, 2048)}
"""Qwen3-Next's expert projections: ``(K, N)``."""
CASES = [(p, e, s) for s in (320, 1280) for e in (16, 512) for p in PROJECTIONS] + \
        [(p, e, s) for s in (10, 40960) for e in (16, 512) for p in PROJECTIONS]
"""Decode 32 / 128 (top-10) first, then one token and a 4,096-token prefill."""
LAUNCHES = ("16x32x128w4s4,32x32x128w4s4,32x64x128w4s4,32x64x64w4s4,64x64x128w4s3,32x128x64w8s3,16x64x128w4s6,"
            "128x64x64w8s3,128x32x128w8s3")
"""``--launches``' default: ``BLOCK_M x BLOCK_N x BLOCK_K``, warps, stages. The two 128-row launches (added
after the H100 run of 2026-12-07): one block for a group of up to 128 rows, so decode 128's 80-row groups
stream the weights once, not twice (1,280 pairs over 16 experts: 1.75x torch's at the 64-row launch)."""
COLUMNS = (("proj", "projection", ""), ("E", "experts", ","), ("S", "pairs", ","), ("used", "experts used", ","),
           ("torch_us", "torch us", ".1f"), ("kda_us", "kda us", ".1f"), ("launch", "kda launch", ""),
           ("best", "best candidate", ""), ("best_us", "best us", ".1f"), ("floor_us", "floor us", ".1f"),
           ("kda_over_torch", "kda / torch", ".3f"), ("kda_over_floor", "kda / floor", ".2f"), ("check", "check", ""))


def parse_launch(label: str) -> tuple[int, int, int, int, int]:
    import re

    got = re.fullmatch(r"(\d+)x(\d+)x(\d+)w(\d+)s(\d+)", label.strip())
    if got is None:
        raise SystemExit(f"--launches: {label!r} is not like 32x64x128w4s4 (BLOCK_M x BLOCK_N x BLOCK_K, warps, stages)")
    return tuple(int(v) for v in got.groups())


def make_case(proj: str, experts: int, pairs: int, device, dtype=torch.bfloat16):
    """``(x, w, offs, used)``: the pairs' rows sorted by expert, the ``[E, N, K]`` weights transposed, the
    groups' ends, how many experts have rows."""
    K, N = PROJECTIONS[proj]
    k = min(10, experts)
    g = torch.Generator(device=device).manual_seed(pairs + experts)
    ids = torch.rand(-(-pairs // k), experts, generator=g, device=device).topk(k, dim=-1).indices.reshape(-1)[:pairs]
    counts = torch.bincount(ids, minlength=experts)
    offs = counts.cumsum(0).to(torch.int32)
    x = torch.randn(pairs, K, generator=g, device=device).to(dtype)
    w = (torch.randn(experts, N, K, generator=g, device=device) / K ** 0.5).to(dtype).transpose(1, 2)
    return x, w, offs, int((counts > 0).sum())


def run(proj: str, experts: int, pairs: int, launches, *, smoke: bool, reps: int, bandwidth: float | None) -> dict:
    device = "cpu" if smoke else "cuda"
    x, w, offs, used = make_case(proj, experts, pairs, device, torch.float16 if smoke else torch.bfloat16)
    K, N = PROJECTIONS[proj]
    sms = 132 if smoke else None
    chosen = L.launch_for(pairs, experts, K, N, sms or torch.cuda.get_device_properties(0).multi_processor_count)
    want = L.reference(x, w, offs) if smoke else torch._grouped_mm(x, w, offs=offs)
    outs = {name: torch.empty(pairs, N, dtype=x.dtype, device=device) for name in ["kda", *launches]}
    forms = {name: (lambda o=o, lch=(chosen if name == "kda" else parse_launch(name)):
                    L.grouped_triton(x, w, offs, o, launch=lch, sms=sms)) for name, o in outs.items()}
    if not smoke:
        forms["torch"] = lambda: torch._grouped_mm(x, w, offs=offs)
    row = {"proj": proj, "E": experts, "S": pairs, "used": used, "launch": "{}x{}x{}w{}s{}".format(*chosen)}
    timer = ((lambda f: perf_counter_median_us(f, reps)) if smoke
             else (lambda f: graph_replay_median_us(f, reps=reps, inner=5, calls=5)))
    for name, fn in forms.items():
        row[f"{name}_us"] = timer(fn)
    bad = [name for name, o in outs.items() if not torch.allclose(o.float(), want.float(), rtol=2e-2, atol=2e-2)]
    row["check"] = "ok" if not bad else "BAD " + ", ".join(bad)
    cands = [c for c in launches if f"{c}_us" in row]
    row["best"] = min(cands, key=lambda c: row[f"{c}_us"]) if cands else "-"
    row["best_us"] = row.get(f"{row['best']}_us")
    nbytes = (used * K * N + pairs * (K + N)) * x.element_size()
    row["floor_us"] = nbytes / bandwidth * 1e6 if bandwidth else None
    row["kda_over_torch"] = row["kda_us"] / row["torch_us"] if row.get("torch_us") else None
    row["kda_over_floor"] = row["kda_us"] / row["floor_us"] if row["floor_us"] else None
    return row


def report_row(proj: str, experts: int, pairs: int, s) -> dict:
    """One case for ``benchmarks/report.py`` (``s``: its ``Settings``): stock is torch's grouped GEMM (what
    Inductor calls for ``aten._grouped_mm``), kda the op."""
    bandwidth = None if s.smoke else measure_copy_bandwidth("cuda", 1 << 30)
    row = run(proj, experts, pairs, [], smoke=s.smoke, reps=s.reps, bandwidth=bandwidth)
    return {"rewrite": NAME, "shape": f"{proj} E={experts} S={pairs}", "T": pairs, "stock_us": row.get("torch_us"),
            "kda_us": row["kda_us"]}


def report_jobs(s) -> list:
    """The report's rows: Qwen3-Next's gate-up projection at decode 32 and 128, 16 experts."""
    if s.smoke:
        return [lambda: report_row("down", 4, 24, s)]
    return [lambda n=n: report_row("gate_up", 16, n, s) for n in (320, 1280)]


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget", type=float, default=150, help="seconds; the cases after it are skipped")
    p.add_argument("--launches", default=LAUNCHES, help="candidate launches, comma-separated ('' for none)")
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--no-record", action="store_true")
    p.add_argument("--smoke", action="store_true", help="tiny CPU run (the Triton interpreter): checks only")
    args = p.parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (use --smoke on CPU, with TRITON_INTERPRET=1)")
    launches = [c.strip() for c in args.launches.split(",") if c.strip()]
    for c in launches:
        parse_launch(c)
    PROJECTIONS.update({"tiny": (48, 40)} if args.smoke else {})
    cases = [("tiny", 4, 24), ("tiny", 6, 10)] if args.smoke else CASES
    reps, bandwidth = (2, None) if args.smoke else (args.reps or 30, measure_copy_bandwidth("cuda"))
    t0, rows = time.perf_counter(), []
    for proj, experts, pairs in cases:
        if time.perf_counter() - t0 > args.budget:
            print(f"{proj} E={experts} S={pairs}: skipped, --budget spent", flush=True)
            continue
        rows.append(run(proj, experts, pairs, ["16x16x16w4s2"] if args.smoke else launches, smoke=args.smoke,
                        reps=reps, bandwidth=bandwidth))
        progress(rows[-1])
    notes = ("NOT meaningful (CPU smoke run)" if args.smoke else
             f"CUDA-graph replay medians, 5 calls per graph, per call; copy bandwidth {bandwidth / 1e12:.2f} TB/s")
    finish(NAME, rows, COLUMNS, notes, smoke=args.smoke, record=not args.no_record,
           results_dir=_HERE / "results", started=t0)
    return rows


if __name__ == "__main__":
    main()
