"""Sweep the causal_conv1d kernels' launch configs on a GPU and print the tables to paste.

Times ``conv_triton`` alone (bf16, K = 4, silu, no bias; the projection form ``[1, T, C]``
transposed, as the op reads it) by CUDA-graph replay for each candidate prefill config
(``LaunchConfig``: tokens x channels a program, warps, pipeline stages, rows a step, register
window or blocks of taps) at every width of ``WIDTHS`` and token count of ``TOKENS`` (the first
of each class of ``PREFILL_CONFIGS``), and each candidate update config (``UpdateConfig``) for
one-token decode at ``DECODE_BATCHES`` rows. Each result is checked bit-exact against the
shipped table's launch. Prints every timing, the best per shape, the best per class of the
tables (summed over the widths that class covers: each width's time over its best there) and
``PREFILL_CONFIGS`` / ``UPDATE_CONFIGS`` ready to paste into
``kda_inductor/lowerings/_conv_configs.py`` (classes the budget left unmeasured keep their
row). Records ``benchmarks/results/tune_causal_conv1d.{md,json}``.

    python benchmarks/tune_causal_conv1d.py --budget 250    # what .ci/gpu tune-causal_conv1d runs (a 300 s call)
    python benchmarks/tune_causal_conv1d.py --widths 8192 --tokens 4096,16384
    python benchmarks/tune_causal_conv1d.py --first --budget 150 --widths 8192,12288 --tokens 4096,16384
    TRITON_INTERPRET=1 python benchmarks/tune_causal_conv1d.py --smoke    # CPU, tiny: the code path only
    python benchmarks/tune_causal_conv1d.py --registers --widths 8192     # no GPU: registers for sm_90

Widths run one at a time in ``WIDTHS`` order; no new (width, config) compile starts past
``--budget`` seconds (each compiles once per width: the channels are a constexpr).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE), str(_HERE.parent)]
from _timing import (  # noqa: E402
    environment_info,
    graph_replay_median_us,
    markdown_table,
    measure_copy_bandwidth,
    print_table,
    record_results,
    write_out_json,
)

from kda_inductor.lowerings import causal_conv1d as L  # noqa: E402
from kda_inductor.lowerings._conv_configs import fit, fit_update  # noqa: E402

NAME = "tune_causal_conv1d"
K = 4
WIDTHS = (8192, 12288, 4096, 11520)
"""Qwen3-Next / Qwen3.5; Kimi Linear and Bailing in transformers; Kimi in vLLM / Lara; OLMo-hybrid
(last: 12288's class covers it, so a spent budget leaves no class unmeasured)."""
TOKENS = (1, 64, 512, 4096, 16384)
DECODE_BATCHES = (1, 32, 128)
LC, UC = L.LaunchConfig, L.UpdateConfig
PREFILL_FIRST = (
    # the streaming window (each step's rows loaded a step ahead; ``_conv_stream.py``) with the
    # grouped-division silu and packed rounding (ptx), unrolled (registers for sm_90, Triton
    # 3.9): 8 channels x 2 rows a thread, 4 steps an iteration (128, one wave at 8192 x 4096),
    # 2 steps (114), 4 x 2 (72), 4 x 4 (95), longer / shorter / wider programs; then without
    # the unroll and without ptx, to tell the three apart
    LC(64, 256, 1, 1, 2, True, True, True, 4), LC(64, 256, 1, 1, 2, True, True, True, 2),
    LC(64, 128, 1, 1, 2, True, True, True, 4), LC(64, 128, 1, 1, 4, True, True, True, 2),
    LC(128, 256, 1, 1, 2, True, True, True, 4), LC(32, 128, 1, 1, 2, True, True, True, 4),
    LC(64, 512, 2, 1, 2, True, True, True, 4), LC(64, 256, 1, 1, 2, True, True, True),
    LC(64, 256, 1, 1, 2, True, True, False, 4),
)
"""Timed first (before the table's own entries): the kernel bodies added after the first sweep."""
PREFILL_CANDIDATES = (
    # blocks of taps, 8 values a thread (72 registers for sm_90: --registers), tokens a program
    LC(16, 128, 4, 1, 8, False), LC(32, 128, 4, 1, 8, False), LC(64, 128, 4, 1, 8, False),
    LC(128, 128, 4, 1, 8, False), LC(64, 256, 8, 1, 8, False), LC(64, 64, 2, 1, 8, False),
    # a pipelined loop (80), 16 values a thread (108), 8 warps on 16 rows (78)
    LC(64, 128, 4, 2, 8, False), LC(64, 128, 4, 1, 16, False), LC(64, 128, 8, 1, 16, False),
    # the register window: 4 channels x 2 rows a thread (76), 8 x 2 (98), the kernel measured on
    # 2026-12-03 (64 x 1024, 4 warps, 8 rows: 213)
    LC(64, 128, 1, 1, 2, True), LC(64, 256, 1, 1, 2, True), LC(64, 1024, 4, 1, 8, True),
)
UPDATE_CANDIDATES = (UC(64, 1), UC(128, 1), UC(256, 1), UC(256, 2), UC(512, 2), UC(512, 4), UC(1024, 4),
                     UC(1024, 8), UC(64, 1, True), UC(128, 1, True), UC(256, 2, True), UC(512, 4, True),
                     UC(32, 1), UC(64, 2), UC(128, 2), UC(128, 4), UC(256, 4), UC(256, 8), UC(512, 8),
                     UC(128, 4, True), UC(256, 8, True), UC(64, 1, vector=True), UC(64, 2, vector=True),
                     UC(128, 4, vector=True), UC(256, 2, vector=True), UC(256, 8, vector=True), UC(128, 1, vector=True))
"""The update launches timed: channel blocks x warps, and (``tile``) the one-token update through the
multi-token path (the state read once as a tile). From ``UC(32, 1)`` on: one or two channels a thread
(FLA's update runs about one; the launcher capped warps at 128 channels a warp before 2026-12-08, so
the first sweeps timed 2-4 a thread only). ``--registers`` for sm_90 here (2026-12-08; Triton 3.9, in brackets 3.6,
the device's): the shipped 256 x 2 takes 80 (72) registers, 24 (28) warps an SM; 128 x 1 tile 66 (72), 31
(28); 64 x 1 55 (52), 32 (one-warp programs: 32 an SM at most); one channel a thread (64 x 2, 128 x 4,
256 x 8, with or without the tile or the vector form) 30-32 registers, 64 warps an SM on both: the most
loads in flight for a step that is all latency (B 32: 5 MB). ``vector``: the decode's vector form
(the state's and weights' rows as one load each, the shifted row one store)."""
COLUMNS = (("kind", "kind", "s"), ("C", "C", ","), ("T", "T", ","), ("B", "B", ","), ("config", "config", "s"),
           ("us", "us", ".2f"), ("floor_us", "floor us", ".2f"), ("over_floor", "/floor", ".2f"),
           ("exact", "exact", "s"), ("table", "table's", "s"), ("best", "best", "s"))


def _cfg_text(cfg) -> str:
    """The config as Python; a ``LaunchConfig``'s trailing ``prefetch`` / ``ptx`` / ``unroll``
    left out where they are the defaults (the first sweep's form)."""
    vals, defaults = tuple(cfg), cfg._field_defaults
    while len(vals) > 6 and vals[-1] == defaults.get(cfg._fields[len(vals) - 1], object()):
        vals = vals[:-1]
    return f"{type(cfg).__name__}{vals}"


def _bytes(T: int, B: int, C: int, decode: bool) -> int:
    """x read and y written (bf16), the weight; decode: the state read and written."""
    return 2 * (2 * B * T * C + C * K + (2 * B * C * K if decode else 0))


class Shape:
    """One timed shape's tensors and the table's own result (the bit-exact reference)."""

    def __init__(self, kind: str, C: int, T: int, B: int, device):
        g = torch.Generator().manual_seed(C + T + B)
        self.kind, self.C, self.T, self.B = kind, C, T, B
        self.x = torch.randn(B, T, C, generator=g).to(torch.bfloat16).to(device).transpose(1, 2)
        self.w = (0.3 * torch.randn(C, K, generator=g)).to(torch.bfloat16).to(device)
        self.state = torch.randn(B, C, K, generator=g).to(torch.bfloat16).to(device) if kind == "decode" else None
        self.out = torch.empty(B, T, C, dtype=torch.bfloat16, device=device).transpose(1, 2)
        self.want_state = None if self.state is None else self.state.clone()
        self.want = self.call(None).clone()

    def call(self, cfg):
        if self.state is not None:
            return L.conv_triton(self.x, self.w, None, self.state, update=True, config=cfg, out=self.out)
        return L.conv_triton(self.x, self.w, None, config=cfg, out=self.out)

    def default(self):
        return (L.update_config(self.T, self.C, self.B) if self.kind == "decode"
                else L.launch_config(self.T, self.C, self.B))

    def fitted(self, cand):
        """The launch a table entry ``cand`` gives this shape (the launcher's caps)."""
        return fit_update(cand, self.C) if self.kind == "decode" else fit(cand, self.T, self.C)


def _time(shape: Shape, cfg, smoke: bool) -> tuple[float, str]:
    """Microseconds of one launch (CUDA-graph replay; smoke: one timed call) and whether the
    result is bit-exact with the table's launch (the decode state restored first)."""
    if shape.state is not None:
        shape.state.copy_(shape.want_state)
    got = shape.call(cfg).clone()
    exact = torch.equal(got, shape.want)
    if shape.state is not None:
        exact = exact and torch.equal(shape.state, _shifted(shape))
    if smoke:
        t0 = time.perf_counter()
        shape.call(cfg)
        return (time.perf_counter() - t0) * 1e6, "yes" if exact else "NO"
    us = graph_replay_median_us(lambda: shape.call(cfg), reps=10, inner=3, calls=10)
    return us, "yes" if exact else "NO"


def _shifted(shape: Shape):
    """The decode state after one step from ``want_state``."""
    return torch.cat([shape.want_state, shape.x.to(shape.want_state.dtype)], -1)[:, :, shape.T:]


ONLY_FIRST = False
"""``--first``: ``PREFILL_FIRST`` and the tables' own configs alone (the first sweeps timed the rest)."""


def candidates(kind: str, smoke: bool) -> list:
    """``PREFILL_FIRST``, the table's own entries, then the sweep's others (smoke: the first two
    of each list and the table's; ``ONLY_FIRST``: no others)."""
    table = [c for _, _, c, _ in L.PREFILL_CONFIGS] if kind == "prefill" else [c for _, c, _ in L.UPDATE_CONFIGS]
    first = list(PREFILL_FIRST) if kind == "prefill" else []
    extra = () if ONLY_FIRST else PREFILL_CANDIDATES if kind == "prefill" else UPDATE_CANDIDATES
    return list(dict.fromkeys((first[:2] if smoke else first) + table + list(extra[:2] if smoke else extra)))


def sweep(widths, tokens, batches, deadline: float, device, bandwidth, smoke: bool) -> tuple[list[dict], list[str]]:
    """Every candidate on every shape of each width, the launch each gives a shape (the launcher's
    caps: several candidates may give one) compiled once per width and timed once; nothing new
    starts past ``deadline``. Returns the rows and what the budget left out."""
    rows, skipped = [], []
    for C in widths:
        shapes = [Shape("prefill", C, T, 1, device) for T in tokens] + \
                 [Shape("decode", C, 1, B, device) for B in batches]
        for kind in ("prefill", "decode"):
            mine = [s for s in shapes if s.kind == kind]
            launches = {id(s): {s.fitted(c) for c in candidates(kind, smoke)} for s in mine}
            for cfg in dict.fromkeys(s.fitted(c) for c in candidates(kind, smoke) for s in mine):
                if time.perf_counter() > deadline:
                    skipped.append(f"C={C} {kind} {_cfg_text(cfg)}")
                    continue
                rows += [_row(s, cfg, bandwidth, smoke) for s in mine if cfg in launches[id(s)]]
        del shapes
        if device == "cuda":
            torch.cuda.empty_cache()
    return mark_best(rows), skipped


def _row(s: Shape, cfg, bandwidth, smoke: bool) -> dict:
    row = {"kind": s.kind, "C": s.C, "T": s.T, "B": s.B, "config": _cfg_text(cfg), "cfg": cfg, "shape": s,
           "table": "yes" if cfg == s.default() else ""}
    try:
        row["us"], row["exact"] = _time(s, cfg, smoke)
    except Exception as e:  # noqa: BLE001 - a config that fails to compile or launch is reported
        row["us"], row["exact"] = None, f"{type(e).__name__}: {e}"[:100]
    if bandwidth and row["us"]:
        row["floor_us"] = _bytes(s.T, s.B, s.C, s.kind == "decode") / bandwidth * 1e6
        row["over_floor"] = row["us"] / row["floor_us"]
    print(f"{s.kind} C={s.C} T={s.T} B={s.B} {row['config']}: "
          f"{'-' if row['us'] is None else format(row['us'], '.2f')} us, exact {row['exact']}", flush=True)
    return row


def mark_best(rows: list[dict]) -> list[dict]:
    """``best`` on each shape's fastest bit-exact config."""
    for key in dict.fromkeys((r["kind"], r["C"], r["T"], r["B"]) for r in rows):
        mine = [r for r in rows if (r["kind"], r["C"], r["T"], r["B"]) == key and r["us"] and r["exact"] == "yes"]
        for r in mine:
            r["best"] = "best" if r is min(mine, key=lambda r: r["us"]) else ""
    return rows


def _class_choice(rows: list[dict], kind: str, smoke: bool) -> tuple[object, str] | None:
    """The candidate with the least mean time over the class's shapes (each over that shape's
    best), among those whose launch was timed bit-exact on every one of them; its note."""
    timed = {}
    for r in rows:
        if r["us"] and r["exact"] == "yes":
            timed[(r["C"], r["T"], r["B"], r["cfg"])] = r["us"]
    shapes = {(r["C"], r["T"], r["B"]): r["shape"] for r in rows}
    best = {sh: min(us for (c, t, b, _), us in timed.items() if (c, t, b) == sh) for sh in shapes
            if any((c, t, b) == sh for c, t, b, _ in timed)}
    scores, times = {}, {}
    for cand in candidates(kind, smoke):
        mine = {sh: timed.get((*sh, shapes[sh].fitted(cand))) for sh in best}
        if best and all(v is not None for v in mine.values()):
            scores[cand] = sum(mine[sh] / best[sh] for sh in best) / len(best)
            times[cand] = mine
    if not scores:
        return None
    cand = min(scores, key=scores.get)
    at = "T" if kind == "prefill" else "B"
    text = ", ".join(f"{us:.2f} us at C={sh[0]} {at}={sh[1] if kind == 'prefill' else sh[2]}"
                     for sh, us in sorted(times[cand].items()))
    before = ", ".join(f"{r['us']:.2f}" for r in rows if r["table"] and r["us"])
    return cand, f"{text} (the table's before: {before or '-'} us)"


def _prefill_class(tokens: int, channels: int) -> tuple[int, int]:
    """The ``(from tokens, from channels)`` of the ``PREFILL_CONFIGS`` row a shape takes."""
    return [(t, c) for t, c, _, _ in L.PREFILL_CONFIGS if tokens >= t and channels >= c][-1]


def tables(rows: list[dict], env: str, smoke: bool = False) -> tuple[list[dict], str]:
    """The best per class of ``PREFILL_CONFIGS`` / ``UPDATE_CONFIGS`` and the tables to paste."""
    summary, lines = [], ["PREFILL_CONFIGS = ("]
    for t, c, cfg, note in L.PREFILL_CONFIGS:
        mine = [r for r in rows if r["kind"] == "prefill" and _prefill_class(r["T"], r["C"]) == (t, c)]
        got = _class_choice(mine, "prefill", smoke) if mine else None
        new, text = (got[0], f"T >= {t}, C >= {c}: {got[1]}; {env}") if got else (cfg, note + " (not measured)")
        summary.append({"class": f"T >= {t}, C >= {c}", "config": _cfg_text(new), "note": text})
        lines.append(f"    ({t}, {c}, {_cfg_text(new)},\n     {text!r}),")
    lines += [")", "", "UPDATE_CONFIGS = ("]
    starts = [s for s, _, _ in L.UPDATE_CONFIGS] + [1 << 62]
    for i, (start, cfg, note) in enumerate(L.UPDATE_CONFIGS):
        mine = [r for r in rows if r["kind"] == "decode" and start <= r["B"] * r["C"] < starts[i + 1]]
        got = _class_choice(mine, "decode", smoke) if mine else None
        new, text = (got[0], f"B * C >= {start}: {got[1]}; {env}") if got else (cfg, note + " (not measured)")
        summary.append({"class": f"update B * C >= {start}", "config": _cfg_text(new), "note": text})
        lines.append(f"    ({start}, {_cfg_text(new)},\n     {text!r}),")
    lines.append(")")
    return summary, "\n".join(lines)


def registers(widths, smoke: bool) -> list[dict]:
    """Each candidate's registers a thread and local memory (spills) compiled for sm_90 (bf16,
    K = 4, silu; Triton's run-time specialization of 16-divisible arguments assumed), and the
    warps an SM its registers leave room for: no GPU needed (Triton's CUDA backend and its
    ``cuobjdump``)."""
    import os
    import re
    import subprocess
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kda_inductor.lowerings import _conv_kernels as kernels
    from kda_inductor.lowerings._conv_configs import aot_geometry

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    ptrs = {n: "*bf16" for n in ("x0", "x1", "x2", "x3", "w_ptr", "b_ptr", "s_ptr", "y_ptr")}
    ints = {n: "i32" for n in ("T", "S", "sx_b", "sx_t", "sx_c", "ss_n", "ss_c", "ss_t", "sw_c", "sw_k")}
    unaligned = ("S", "num_seqs", "sx_c", "ss_c", "ss_t", "sw_k")
    base = dict(K=K, HAS_BIAS=False, SILU=True, W_KIND=1, ACT_KIND=1, OUT_KIND=1, HW=True, X_UNIT=True)
    rows = []
    for C in widths:
        for kind in ("prefill", "decode"):
            for cand in candidates(kind, smoke):
                if kind == "prefill":
                    kernel, types = kernels.prefill_kernel, dict(ptrs, cu_ptr="*i32", num_seqs="i32", **ints)
                    consts = dict(base, **aot_geometry(((1, C, 0),), cand.block_c), HAS_STATE=False, VARLEN=False,
                                  STEPS=1, BLOCK_T=cand.block_t, ROWS=cand.rows, NUM_STAGES=cand.num_stages,
                                  WINDOW=cand.window, PREFETCH=cand.prefetch, PTX=cand.ptx,
                                  UNROLL=cand.unroll)
                else:
                    kernel, types = kernels.update_kernel, dict(ptrs, **ints)
                    consts = dict(base, **aot_geometry(((1, C, 0),), cand.block_c), S_P2=4, SS_C=4, S_W=4, CONV=True,
                                  ONE=not cand.tile, VECTOR=cand.vector, S_KIND=1)
                names = kernel.arg_names
                src = ASTSource(fn=kernel, signature={n: types.get(n, "constexpr") for n in names},
                                constexprs={(names.index(k),): v for k, v in consts.items()},
                                attrs={(names.index(n),): [["tt.divisibility", 16]] for n in types if n not in unaligned})
                compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": cand.num_warps})
                with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                    f.write(compiled.asm["cubin"])
                    f.flush()
                    usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
                regs, local = (int(re.search(rf"{k}:(\d+)", usage).group(1)) for k in ("REG", "LOCAL"))
                ctas = min(32, 65536 // (regs * 32 * cand.num_warps))
                rows.append({"kind": kind, "C": C, "config": _cfg_text(cand), "regs": regs, "local": local,
                             "warps_per_sm": min(64, ctas * cand.num_warps)})
                print(f"{kind} C={C} {rows[-1]['config']}: {regs} registers, {local} bytes local, "
                      f"{rows[-1]['warps_per_sm']} warps an SM", flush=True)
    return rows


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--widths", default=",".join(map(str, WIDTHS)))
    p.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    p.add_argument("--batches", default=",".join(map(str, DECODE_BATCHES)))
    p.add_argument("--budget", type=float, default=250, help="seconds after which no new compile starts")
    p.add_argument("--no-record", action="store_true")
    p.add_argument("--smoke", action="store_true", help="CPU under TRITON_INTERPRET=1, tiny shapes: the code path")
    p.add_argument("--first", action="store_true",
                   help="only PREFILL_FIRST and the tables' own configs (the earlier sweeps timed the others)")
    p.add_argument("--registers", action="store_true",
                   help="no timing, no GPU: each candidate's registers for sm_90 (without TRITON_INTERPRET)")
    args = p.parse_args(argv)
    global ONLY_FIRST
    ONLY_FIRST = args.first
    if args.registers:
        return registers([int(v) for v in args.widths.split(",")][:1 if args.smoke else None], args.smoke)
    t0 = time.perf_counter()
    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (--smoke under TRITON_INTERPRET=1 on CPU)")
    widths = (40, 136) if args.smoke else tuple(int(v) for v in args.widths.split(","))
    tokens = (1, 3, 70) if args.smoke else tuple(int(v) for v in args.tokens.split(","))
    batches = (1, 2) if args.smoke else tuple(int(v) for v in args.batches.split(","))
    bandwidth = None if args.smoke else measure_copy_bandwidth(device)
    info = environment_info()
    env = "CPU smoke: NOT a measurement" if args.smoke else \
        f"{info['gpu']}, triton {info['triton']}, {info['date']}: benchmarks/results/{NAME}.md"
    rows, skipped = sweep(widths, tokens, batches, t0 + args.budget, device, bandwidth, args.smoke)
    print_table(rows, COLUMNS, title="causal_conv1d launch configs (kernel alone, bf16, K=4)")
    print_table([r for r in rows if r.get("best")], COLUMNS, title="best per shape")
    summary, paste = tables(rows, env, args.smoke)
    print_table(summary, (("class", "class", "s"), ("config", "best config", "s"), ("note", "measured", "s")),
                title="best per class (mean over the class's widths of each time over that width's best)")
    if skipped:
        print(f"--budget {args.budget:.0f} s spent: {len(skipped)} (width, config) pairs not run, e.g. {skipped[:3]}")
    print("\n# ---- paste into kda_inductor/lowerings/_conv_configs.py ----\n" + paste, flush=True)
    print(f"({time.perf_counter() - t0:.0f} s)")
    if not args.smoke:
        clean = [{k: v for k, v in r.items() if k not in ("cfg", "shape")} for r in rows]
        payload = {"env": info, "rows": clean, "classes": summary, "paste": paste, "skipped": skipped}
        write_out_json(f"{NAME}.json", payload)
        if not args.no_record:
            record_results(NAME, payload, markdown_table(summary, (("class", "class", "s"), ("config", "config", "s"),
                                                                   ("note", "measured", "s")))
                           + "\n\n" + markdown_table([r for r in rows if r.get("best") or r["table"]], COLUMNS),
                           results_dir=_HERE / "results", title="causal_conv1d launch-config sweep",
                           notes=f"CUDA-graph replay medians, 10 calls a graph, kernel alone; copy bandwidth "
                                 f"{bandwidth / 1e12:.2f} TB/s; best per class, then per shape (and the table's)")
    return rows


if __name__ == "__main__":
    main()
