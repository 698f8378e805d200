"""One report of every rewrite and of the hybrid model, on a GPU: ``python -m benchmarks.report``.

    python -m benchmarks.report                 # ~7 min on an H200 (bf16 and FP8 models), compiles included
    python -m benchmarks.report --quick         # decode and prefill sizes only (~4 min)
    python -m benchmarks.report --only model    # or: rewrites, or one rewrite's name
    python -m benchmarks.report --smoke         # CPU, tiny sizes, fake-fast: checks the code paths

Sections (progress lines on stderr as each row finishes; the final table printed last):

* **rewrites**: for every registered rewrite (``kda_inductor.REWRITE_NAMES``), the rows its
  benchmark ``benchmarks/bench_<name>.py`` gives (``report_jobs``) at a few token counts:
  eager, stock ``torch.compile``, kda_inductor, the floor (bytes that must move over the
  measured copy bandwidth) and, for ``gated_norm_merge``, flash-linear-attention's fused gated
  RMSNorm (``rms_norm_gated`` after the two ``index_copy_``) where ``fla-core`` is installed.
  Also at the hybrid model's own shapes (the GDN and the KDA layer's split, the model's gather).
* **model**: the hybrid model (``examples/hybrid_model.py``, real dims, the fla core where
  installed) for a T=256 spec-decode step and a 16K-token prefill step: eager, stock
  ``torch.compile`` (with the cache write left eager where stock Inductor cannot compile it),
  kda_inductor; compile times and our pass's own time; checked against eager first. The same
  with FP8 output projections (``--models bf16,fp8``; steps ``spec fp8``, ``prefill fp8``:
  ``make_model(fp8=True)``), where the layers' merge + norm + input quantization is
  ``gated_norm_quant``'s: also kda with it (``kda+gnq``: its speed rule bypassed where the
  default compile left it) and kda without it (``kda-no-gnq``), the rewrite's whole-step evidence.
* **targets**: per step, stock minus kda against the sum of the per-rewrite savings at the
  step's sizes (target >= 80%), and the share of the step the rewritten regions take before
  and after (region times from the isolated benchmarks at the step's shapes; a rewrite's
  benchmark may name its own regions: ``step_regions``); for the FP8 steps kda is kda+gnq, and
  kda-no-gnq minus kda+gnq in the step against the same difference in isolation.

All GPU times are CUDA-graph replay medians (``_timing``). Writes ``report.md``,
``report.json``, ``report_rewrites.png`` and ``report_model.png`` to ``benchmarks/results/``
(unless ``--no-record``) and to ``$OUT`` when set. Stops itself after ``--timeout`` seconds
(default 540), writing what it has.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import shutil
import signal
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

_HERE = Path(__file__).resolve().parent
for p in (str(_HERE), str(_HERE.parent / "examples"), str(_HERE.parent)):
    if p not in sys.path:
        sys.path.insert(0, p)

import _timing as T  # noqa: E402

from kda_inductor import REWRITE_NAMES as REWRITES  # noqa: E402  (the registry: the only list of rewrites)
SIZES = (64, 256, 4096, 16384)
QUICK_SIZES = (256, 16384)
SMOKE_SIZES = (12, 24)
STEPS = {"spec": 256, "prefill": 16384}
MODELS = ("bf16", "fp8")
"""The hybrid model as is, and with FP8 output projections (``make_model(fp8=True)``)."""
SMOKE_STEPS = {"spec": 24, "prefill": 20}
FILES = ("report.md", "report.json", "report_rewrites.png", "report_model.png")
COLUMNS = (("rewrite", "rewrite", "s"), ("shape", "shape", "s"), ("T", "T / N", ","),
           ("eager_us", "eager us", ".1f"), ("stock_us", "stock us", ".1f"), ("peer_us", "peer us", ".1f"),
           ("kda_us", "kda us", ".1f"), ("floor_us", "floor us", ".1f"), ("stock_over_kda", "stock/kda", ".2f"),
           ("kda_over_floor", "kda/floor", ".2f"))
MODEL_COLUMNS = (("step", "step", "s"), ("T", "tokens", ","), ("core", "core", "s"), ("eager_us", "eager us", ",.0f"),
                 ("stock_us", "stock us", ",.0f"), ("kda_us", "kda us", ",.0f"), ("kda_gnq_us", "kda+gnq us", ",.0f"),
                 ("kda_no_gnq_us", "kda-no-gnq us", ",.0f"), ("stock_over_kda", "stock/kda", ".3f"),
                 ("stock_compile_s", "stock compile s", ".1f"), ("kda_compile_s", "kda compile s", ".1f"),
                 ("pass_s", "our pass s", ".2f"), ("compile_overhead", "compile +%", ".1%"))
TARGET_COLUMNS = (("step", "step", "s"), ("saved_us", "stock - kda us", ",.1f"),
                  ("sum_savings_us", "sum of rewrite savings us", ",.1f"), ("fraction", "fraction", ".0%"),
                  ("meets_80pct", ">= 80%", "s"), ("region_share_before", "rewritten share before", ".1%"),
                  ("region_share_after", "after", ".1%"), ("gnq_in_step_us", "FP8: no-gnq - gnq, step us", ",.1f"),
                  ("gnq_isolated_us", "isolated us", ",.1f"))


def log(msg: str) -> None:
    print(f"[report {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Deadline(Exception):
    """The report ran out of its time budget."""


@contextlib.contextmanager
def deadline(seconds: float):
    """Raise :class:`Deadline` in the main thread after ``seconds`` (SIGALRM; POSIX)."""
    if seconds <= 0 or not hasattr(signal, "SIGALRM"):
        yield
        return

    def fire(signum, frame):
        raise Deadline(f"time budget of {seconds:.0f} s spent")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# --------------------------------------------------------------------------- settings
class Settings:
    """What to run and how to time it (GPU: CUDA-graph replay; smoke: ``perf_counter``, or an
    injected ``timer`` in tests)."""

    def __init__(self, args: argparse.Namespace, timer: Callable[[Callable], float] | None = None):
        self.smoke = args.smoke
        self.device = "cpu" if args.smoke else "cuda"
        self.sizes = SMOKE_SIZES if args.smoke else (QUICK_SIZES if args.quick else SIZES)
        self.steps = {k: v for k, v in (SMOKE_STEPS if args.smoke else STEPS).items() if k in args.steps}
        self.models = args.models
        self.all_steps = SMOKE_STEPS if args.smoke else STEPS
        """The model's steps whether or not ``--steps`` runs them (their shapes' isolated rows)."""
        self.reps = args.reps or (1 if args.smoke else 30)
        self.bandwidth = None
        if timer is not None:
            self.timer = timer
        elif args.smoke:
            self.timer = lambda fn: T.perf_counter_median_us(fn, self.reps)
        else:
            self.timer = lambda fn: T.graph_replay_median_us(fn, reps=self.reps, inner=5, calls=5)
        self.model_timer = timer or ((lambda fn: T.perf_counter_median_us(fn, 1)) if args.smoke else None)

    def compile_kda(self, fn):
        """``fn`` compiled with kda_inductor (smoke: rewrites forced, the CPU rules would decline)."""
        return torch.compile(fn, backend="kda_inductor", options={"kda": {"force": True}} if self.smoke else None)

    @staticmethod
    def ratios(row: dict) -> dict:
        """``row`` with its stock/kda and kda/floor ratios."""
        return T.add_ratios(row, (("stock_over_kda", "stock_us", "kda_us"), ("kda_over_floor", "kda_us", "floor_us")))

    def model_times(self, model, variants: dict[str, tuple[Callable, bool]], rounds: int = 3) -> dict[str, float]:
        """Microseconds per step of each ``label: (step, eager_write)``, the model's write run
        eagerly (a graph break) or not as that variant was compiled: switching it re-traces,
        so each variant runs only with its own. On a GPU each step is captured in a CUDA graph
        and the graphs are replayed in alternating rounds (median of the rounds), so that
        clock drift over the run does not favour whichever is timed first."""
        cache = model.attn.kv_cache.clone()
        try:
            if self.model_timer is not None:
                out = {}
                for label, (fn, eager_write) in variants.items():
                    model.attn.eager_write = eager_write
                    out[label] = self.model_timer(fn)
                return out
            captured = {}  # (graph, output): the output lives as long as its graph
            for label, (fn, eager_write) in variants.items():
                model.attn.eager_write = eager_write
                captured[label] = T.capture_graph(fn)
            samples = T.alternating_replay_us({label: g for label, (g, _) in captured.items()}, rounds=rounds)
            return {label: statistics.median(xs) for label, xs in samples.items()}
        finally:
            model.attn.eager_write = False
            model.attn.kv_cache.copy_(cache)


# --------------------------------------------------------------------------- rewrites
def _bench(name: str):
    """A rewrite's benchmark module, ``benchmarks/bench_<name>.py``: its ``report_jobs(s)`` gives
    the report's rows for that rewrite (each job a zero-argument function returning one row)."""
    import importlib

    return importlib.import_module(f"bench_{name}")


def run_rewrites(s: Settings, only: set[str], rows: list[dict], errors: list[str]) -> None:
    # round-robin over the rewrites (each one's smallest size first): a spent time budget
    # leaves every rewrite some rows
    lists = [[(name, job) for job in _bench(name).report_jobs(s)] for name in REWRITES if name in only]
    jobs = [pair for column in itertools.zip_longest(*lists) for pair in column if pair is not None]
    for name, job in jobs:
        t0 = time.perf_counter()
        try:
            rows.append(job())
            log(f"{name}: {_fmt(rows[-1])} ({time.perf_counter() - t0:.0f} s)")
        except Deadline:
            raise
        except BaseException as e:  # noqa: BLE001 - a failing row must not lose the others
            if isinstance(e, KeyboardInterrupt):
                raise
            errors.append(f"{name}: {type(e).__name__}: {e}")
            log(f"{name} FAILED: {errors[-1]}\n{traceback.format_exc(limit=3)}")


def _fmt(row: dict) -> str:
    keys = ("shape", "T", "eager_us", "stock_us", "peer_us", "kda_us", "floor_us")
    return ", ".join(f"{k}={row[k]:.1f}" if isinstance(row.get(k), float) else f"{k}={row.get(k)}"
                     for k in keys if row.get(k) is not None)


# --------------------------------------------------------------------------- the model
def run_model(s: Settings, rows: list[dict], errors: list[str]) -> None:
    """The hybrid model's steps, for each model of ``--models`` (bf16; fp8: FP8 output
    projections, ``hybrid_model.use_fp8_output_projections``): one row per step."""
    import hybrid_model as HM

    cfg = HM.HybridConfig.tiny() if s.smoke else HM.HybridConfig()
    for fp8 in [m == "fp8" for m in MODELS if m in s.models]:
        model = HM.make_model(cfg, device=s.device, fp8=fp8)
        core = "fla" if model.gdn.uses_fla(model.attn.kv_cache) else "torch"
        for step, T_ in s.steps.items():
            label = f"{step} fp8" if fp8 else step
            if step == "prefill" and core == "torch" and not s.smoke:
                errors.append(f"model {label}: skipped, the torch core would unroll a 4096-token loop "
                              "(install fla-core for the real core)")
                continue
            t0 = time.perf_counter()
            try:
                rows.append(model_step(s, model, label, step, T_, core, fp8))
                m = rows[-1]
                log(f"model {label}: eager {m['eager_us']:.0f} us, stock {m['stock_us']} us, kda {m['kda_us']:.0f} us "
                    f"({time.perf_counter() - t0:.0f} s)")
            except Deadline:
                raise
            except Exception as e:  # noqa: BLE001
                errors.append(f"model {label}: {type(e).__name__}: {e}")
                log(f"model {label} FAILED: {errors[-1]}\n{traceback.format_exc(limit=4)}")
            finally:
                model.attn.eager_write = False


def model_step(s: Settings, model, label: str, step: str, T_: int, core: str, fp8: bool) -> dict:
    """One step of ``model``: eager, stock, kda compiled (checked against eager first) and, for
    the FP8 model, kda with and without the FP8 step's own rewrite (:func:`fp8_variants`),
    timed in alternating rounds."""
    import hybrid_model as HM

    from kda_inductor import pass_manager

    batch = HM.spec_decode_batch(model, T_) if step == "spec" else HM.prefill_batch(model, T_)
    args, kwargs = batch.args(), batch.kwargs()
    row = {"step": label, "T": T_, "core": core, "requests": len(batch.kinds),
           "ctx_tokens": batch.indexer.num_ctx_tokens, "ctx_lens": torch.diff(batch.indexer.cu_seq_lens).tolist()}
    # one eager step first: flash-linear-attention's autotuning and kernel builds (per process, the
    # same for every compile) must not be counted against whichever compiles first
    HM.run_step(model, batch)
    torch._dynamo.reset()
    with torch._inductor.config.patch(force_disable_caches=True):
        kda = s.compile_kda(model)
        # what fired in this step's graphs (the speed rules decide per step)
        with pass_manager.timed() as spent, pass_manager.counted() as row["rewrites"]:
            t1 = time.perf_counter()
            HM.run_step(model, batch, kda)
            row["kda_compile_s"] = time.perf_counter() - t1
        row["pass_s"] = sum(spent)
        log(f"model {label}: kda compiled in {row['kda_compile_s']:.0f} s (our pass {row['pass_s']:.2f} s)")
        row["check"] = HM.check_against_eager(model, batch, kda)
        extra = fp8_variants(s, model, batch, row) if fp8 else {}
        stock, row["stock_note"] = _compile_stock(model, batch, row)
    row["compile_overhead"] = row["kda_compile_s"] / row["stock_compile_s"] - 1 if row.get("stock_compile_s") else None
    row["pass_share_of_compile"] = row["pass_s"] / row["kda_compile_s"]
    variants = {"eager_us": (lambda: model(*args, **kwargs), False), "kda_us": (lambda: kda(*args, **kwargs), False)}
    variants.update({key: (lambda fn=fn: fn(*args, **kwargs), False) for key, fn in extra.items()})
    if stock is not None:
        variants["stock_us"] = (lambda: stock(*args, **kwargs), bool(row["stock_note"]))
    with torch.no_grad():
        row["stock_us"] = None
        row.update(s.model_times(model, variants))
    return T.add_ratios(row, (("stock_over_kda", "stock_us", "kda_us"),))


FP8_REWRITE = "gated_norm_quant"
"""The FP8 model's own rewrite (the layers' merge + norm + quantization): its whole-step evidence
is kda with it (its speed rule bypassed where the rule declines) against kda without it."""


rule_bypassed = T.rule_bypassed
"""(``benchmarks/_timing.py``): the rewrite wherever it matches while the block compiles."""


def fp8_variants(s: Settings, model, batch, row: dict) -> dict:
    """The FP8 step compiled with :data:`FP8_REWRITE` (where the default compile left it) and
    without it: ``{"kda_gnq_us": fn, "kda_no_gnq_us": fn}`` to time, their counts in ``row``
    (``rewrites_gnq``, ``rewrites_no_gnq``), the first checked against eager."""
    import hybrid_model as HM

    from kda_inductor import pass_manager

    out = {}
    if not row["rewrites"].get(FP8_REWRITE):  # (no Dynamo reset: the compiled variants must stay compiled)
        # The bypass changes no option: compiled as the default compile was (same backend, same options),
        # Dynamo would reuse that compile's code (its cache entries match by backend and options; the H100
        # run of 2026-12-06 00:07 failed so), and Inductor's FX graph cache would serve it (the run of
        # 2026-12-05 22:31): options of its own, and the graph caches off
        with_it = torch.compile(model, backend="kda_inductor", options={"kda": {"force": bool(s.smoke)}})
        with rule_bypassed(FP8_REWRITE), pass_manager.graph_caches_off(), pass_manager.counted() as row["rewrites_gnq"]:
            HM.run_step(model, batch, with_it)
        if not row["rewrites_gnq"].get(FP8_REWRITE):
            raise AssertionError(f"{FP8_REWRITE} did not fire in the FP8 step with its rule bypassed "
                                 f"({row['rewrites_gnq']}): see explain() on this step")
        row["check_gnq"] = HM.check_against_eager(model, batch, with_it)
        out["kda_gnq_us"] = with_it
    kda_opts = {"disable": [FP8_REWRITE], "force": True} if s.smoke else {"disable": [FP8_REWRITE]}
    without = torch.compile(model, backend="kda_inductor", options={"kda": kda_opts})
    with pass_manager.counted() as row["rewrites_no_gnq"]:
        HM.run_step(model, batch, without)
    out["kda_no_gnq_us"] = without
    return out


def _compile_stock(model, batch, row):
    """Stock torch.compile of the model; where stock Inductor cannot compile the cache write,
    again with the write run eagerly (a graph break around it)."""
    import hybrid_model as HM

    note = ""
    for eager_write in (False, True):
        model.attn.eager_write = eager_write
        # no Dynamo reset: kda's compiled step must stay compiled for its timing (a new
        # torch.compile is a compile of its own: its cache entries are its backend's)
        stock = torch.compile(model, backend="inductor")
        t1 = time.perf_counter()
        try:
            with torch._inductor.config.patch(force_disable_caches=True):  # as the kda compile
                HM.run_step(model, batch, stock)
        except Exception as e:  # noqa: BLE001
            if eager_write:
                raise
            note = f"stock fails to compile ({type(e).__name__}: {str(e).strip().splitlines()[0][:100]}); cache write run eagerly"
            log(f"model: {note}")
            continue
        row["stock_compile_s"] = time.perf_counter() - t1
        return stock, note
    raise AssertionError("unreachable")


# --------------------------------------------------------------------------- targets
def step_regions(step_row: dict, rewrite_rows: list[dict]) -> dict | None:
    """Stock and kda time of the regions the rewrites replace in one model step, from the
    isolated benchmarks at the step's sizes: the GDN and the KDA layer's split, two merges +
    norms, the cache write as the model spells it (quant + write; stock: eager where stock
    fails), the gather; only those that fired in the step (``step_row["rewrites"]``, where
    recorded: the speed rules leave some to Inductor at some steps)."""
    T_ = step_row["T"]
    fired = step_row.get("rewrites_gnq", step_row.get("rewrites"))  # the FP8 step: with its own rewrite

    def find(rewrite, shape=None, t=T_):
        for r in rewrite_rows:
            if r["rewrite"] == rewrite and r["T"] == t and (shape is None or r["shape"] == shape):
                return r
        return None

    gather = next((r for r in rewrite_rows if r["rewrite"] == "indexer_k_gather"
                   and r["shape"] == f"{T_} tok step"), None)
    parts = {"gdn_spec_split (gdn)": find("gdn_spec_split", "gdn"), "gdn_spec_split (kda)": find("gdn_spec_split", "kda"),
             "gated_norm_merge x2": find("gated_norm_merge"), "indexer_k_write": find("indexer_k_write", _bench("indexer_k_write").MODEL_SHAPE),
             "indexer_k_gather": gather}
    if parts["gdn_spec_split (kda)"] is None:  # smoke: the GDN shape stands in
        parts["gdn_spec_split (kda)"] = parts["gdn_spec_split (gdn)"]
    if any(p is None for p in parts.values()):
        return None
    counts = {name: 2 if name.endswith("x2") else 1 for name in parts}
    for name in REWRITES:  # a rewrite's benchmark may name its own regions in the step
        hook = getattr(_bench(name), "step_regions", None)
        for label, (r, n) in (hook(rewrite_rows, step_row) if hook else {}).items():
            parts[label], counts[label] = r, n
    if fired is not None:
        parts = {name: r for name, r in parts.items() if fired.get(name.split(" ")[0])}
    before = after = 0.0
    savings = {}
    for name, r in parts.items():
        n = counts[name]
        b = r["stock_us"] if r.get("stock_us") is not None else r["eager_us"]
        before += n * b
        after += n * r["kda_us"]
        savings[name] = n * (b - r["kda_us"])
    return {"before_us": before, "after_us": after, "savings_us": savings}


def targets(model_rows: list[dict], rewrite_rows: list[dict]) -> list[dict]:
    out = []
    for m in model_rows:
        reg = step_regions(m, rewrite_rows)
        if reg is None or m.get("stock_us") is None:
            continue
        kda_us = m.get("kda_gnq_us") or m["kda_us"]  # the FP8 step: with its own rewrite
        saved = m["stock_us"] - kda_us
        total = sum(reg["savings_us"].values())
        frac = saved / total if total > 0 else None
        out.append({"step": m["step"], "saved_us": saved, "sum_savings_us": total, "fraction": frac,
                    "meets_80pct": "yes" if frac is not None and frac >= 0.8 else "no",
                    "region_share_before": reg["before_us"] / m["stock_us"],
                    "region_share_after": reg["after_us"] / kda_us,
                    "region_before_us": reg["before_us"], "region_after_us": reg["after_us"],
                    "savings_by_rewrite_us": reg["savings_us"], **fp8_evidence(m, rewrite_rows)})
    return out


def fp8_evidence(m: dict, rewrite_rows: list[dict]) -> dict:
    """The FP8 step's own rewrite in the step (kda without it minus kda with it) and in
    isolation (its regions' rows: the norm op + Inductor's quantization minus the fused op)."""
    if m.get("kda_no_gnq_us") is None:
        return {}
    with_it = m.get("kda_gnq_us") or m["kda_us"]
    hook = getattr(_bench(FP8_REWRITE), "step_regions", None)
    regions = hook(rewrite_rows, m) if hook else {}
    isolated = sum(n * (r["kda_no_us"] - r["kda_us"]) for r, n in regions.values()
                   if r.get("kda_no_us") is not None) if regions else None
    return {"gnq_in_step_us": m["kda_no_gnq_us"] - with_it, "gnq_isolated_us": isolated}


# --------------------------------------------------------------------------- output
def plots(payload: dict, out_dir: Path) -> list[Path]:
    """Time vs tokens per rewrite (log-log), and each model step as stacked bars (rewritten
    regions vs the rest, stock vs kda). Needs matplotlib (``pip install 'kda-inductor[report]'``)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed: no plots (pip install 'kda-inductor[report]')")
        return []
    written = []
    env = payload["env"]
    sub = f"{env['gpu'] or 'CPU'}, torch {env['torch']}, triton {env['triton']}, {env['date']}"
    rows = [r for r in payload["rewrites"] if r.get("kda_us")]
    if rows:
        fig, axes = plt.subplots(1, len(REWRITES), figsize=(4.2 * len(REWRITES), 3.8))
        for ax, name in zip(axes, REWRITES):
            mine = sorted((r for r in rows if r["rewrite"] == name and r["shape"] not in ("kda", _bench("indexer_k_write").MODEL_SHAPE)),
                          key=lambda r: r["T"])
            for key, style in (("eager_us", "o:"), ("stock_us", "s--"), ("peer_us", "^-."), ("kda_us", "D-"),
                               ("floor_us", "k-")):
                pts = [(r["T"], r[key]) for r in mine if r.get(key)]
                if pts:
                    ax.plot(*zip(*pts), style, label=key[:-3], lw=1.2, ms=4)
            ax.set(xscale="log", yscale="log", title=name, xlabel="tokens (gather: context tokens)", ylabel="us")
            ax.grid(True, which="both", alpha=0.3)
            if mine:
                ax.legend(fontsize=7)
        fig.suptitle(f"kda_inductor rewrites: CUDA-graph replay medians ({sub})", fontsize=9)
        fig.tight_layout()
        path = out_dir / "report_rewrites.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    tg = {t["step"]: t for t in payload["targets"]}
    steps = [m for m in payload["model"] if m["step"] in tg]
    if steps:
        fig, axes = plt.subplots(1, len(steps), figsize=(4.5 * len(steps), 4))
        axes = [axes] if len(steps) == 1 else axes
        for ax, m in zip(axes, steps):
            t = tg[m["step"]]
            rest = [m["stock_us"] - t["region_before_us"], m["kda_us"] - t["region_after_us"]]
            region = [t["region_before_us"], t["region_after_us"]]
            ax.bar(["stock", "kda"], rest, color="#bbbbbb", label="rest of the step")
            ax.bar(["stock", "kda"], region, bottom=rest, color="#d62728", label="rewritten regions")
            for i, (r0, r1) in enumerate(zip(rest, region)):
                ax.text(i, r0 + r1, f"{r0 + r1:,.0f} us\n({r1 / (r0 + r1):.1%} rewritten)", ha="center",
                        va="bottom", fontsize=7)
            # headroom above the taller bar, so that its label stays clear of the title
            ax.set_ylim(0, 1.2 * max(r0 + r1 for r0, r1 in zip(rest, region)))
            ax.set(title=f"{m['step']} step, {m['T']:,} tokens ({m['core']} core)", ylabel="us per step")
            ax.legend(fontsize=7, loc="lower right")
        fig.suptitle(f"hybrid model step: where the time goes ({sub})", fontsize=9)
        fig.tight_layout()
        path = out_dir / "report_model.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def markdown(payload: dict) -> str:
    env = payload["env"]
    parts = [f"# kda_inductor report\n\n{env['date']}; GPU: {env['gpu']}; torch {env['torch']}; "
             f"triton {env['triton']}; fla {payload.get('fla') or '-'}\n",
             payload["notes"] + "\n",
             "## Rewrites\n", T.markdown_table(payload["rewrites"], COLUMNS),
             "## Hybrid model\n", T.markdown_table(payload["model"], MODEL_COLUMNS),
             "## Targets\n", T.markdown_table(payload["targets"], TARGET_COLUMNS)]
    notes = [m.get("stock_note") for m in payload["model"] if m.get("stock_note")]
    if notes:
        parts.append("\n".join(f"- {n}" for n in dict.fromkeys(notes)) + "\n")
    if payload["errors"]:
        parts.append("## Errors\n\n" + "\n".join(f"- {e}" for e in payload["errors"]) + "\n")
    parts.append("\n![rewrites](report_rewrites.png)\n\n![model](report_model.png)\n")
    return "\n".join(parts)


def write_outputs(payload: dict, out_dirs: list[Path]) -> list[Path]:
    written = []
    first, rest = out_dirs[0], out_dirs[1:]
    first.mkdir(parents=True, exist_ok=True)
    (first / "report.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")
    (first / "report.md").write_text(markdown(payload))
    written += [first / "report.json", first / "report.md", *plots(payload, first)]
    for d in rest:
        d.mkdir(parents=True, exist_ok=True)
        for p in list(written):
            if p.parent == first:
                shutil.copy(p, d / p.name)
                written.append(d / p.name)
    return written


# --------------------------------------------------------------------------- main
def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="rewrites,model",
                   help="comma-separated: rewrites, model, or rewrite names (default: rewrites,model)")
    p.add_argument("--steps", default="spec,prefill", help="model steps: spec, prefill")
    p.add_argument("--models", default=",".join(MODELS), help=f"hybrid models: {', '.join(MODELS)} (default both)")
    p.add_argument("--quick", action="store_true", help=f"rewrites at T in {QUICK_SIZES} only")
    p.add_argument("--reps", type=int, help="timed samples per number (default 30; smoke 1)")
    p.add_argument("--timeout", type=float, default=540, help="stop after this many seconds, writing what ran")
    p.add_argument("--no-record", action="store_true", help="do not write benchmarks/results/")
    p.add_argument("--out", help="also write the files here (default: $OUT when set)")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny sizes: the code paths, meaningless times")
    args = p.parse_args(argv)
    args.only = {x.strip() for x in args.only.split(",") if x.strip()}
    if "rewrites" in args.only:
        args.only |= set(REWRITES)
    bad = args.only - set(REWRITES) - {"rewrites", "model"}
    if bad:
        p.error(f"unknown --only {sorted(bad)}; choose from rewrites, model, {', '.join(REWRITES)}")
    args.models = {x for x in args.models.split(",") if x}
    if args.models - set(MODELS):
        p.error(f"unknown --models {sorted(args.models - set(MODELS))}; choose from {list(MODELS)}")
    args.steps = {x for x in args.steps.split(",") if x}
    if args.steps - set(STEPS):
        p.error(f"unknown --steps {sorted(args.steps - set(STEPS))}; choose from {list(STEPS)}")
    return args


def main(argv=None, *, timer=None) -> dict:
    """Run the report; returns its payload (also written, see the module docstring)."""
    args = parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (use --smoke on CPU to check the code paths)")
    import kda_inductor  # noqa: F401  (the backend, when not pip-installed)

    s = Settings(args, timer)
    started = time.perf_counter()
    rewrite_rows: list[dict] = []
    model_rows: list[dict] = []
    errors: list[str] = []
    try:
        with deadline(args.timeout):
            if not s.smoke:
                log("measuring copy bandwidth")
                s.bandwidth = T.measure_copy_bandwidth("cuda", 1 << 30, reps=5)
            if args.only & set(REWRITES):
                log(f"rewrites at T = {s.sizes}")
                run_rewrites(s, args.only, rewrite_rows, errors)
            if "model" in args.only:
                log(f"hybrid model: steps {s.steps}")
                run_model(s, model_rows, errors)
    except Deadline as e:
        errors.append(f"stopped: {e}; the tables hold what finished")
        log(errors[-1])
    import fla_core

    fla_version = None
    if fla_core.available():
        from importlib.metadata import PackageNotFoundError, version

        with contextlib.suppress(PackageNotFoundError):
            fla_version = version("fla-core")
    notes = ("SMOKE run on CPU: times NOT meaningful. " if s.smoke else
             f"CUDA-graph replay medians (per call). Copy bandwidth {s.bandwidth / 1e12:.2f} TB/s. ")
    notes += ("stock: torch.compile(backend='inductor'); peer: flash-linear-attention's rms_norm_gated after "
              "the two index_copy_; floor: bytes that must move / copy bandwidth. Model steps: a spec-decode "
              "step (3/4 of the tokens speculative, ~1000 tokens of context per request) and a pure prefill "
              "(4 prompts); rewritten-region times come from the isolated benchmarks at the step's shapes, for the rewrites that fired in that step.")
    payload = {"env": T.environment_info(), "fla": fla_version, "notes": notes, "settings": {
        "sizes": list(s.sizes), "steps": s.steps, "reps": s.reps, "smoke": s.smoke},
        "copy_bandwidth_bytes_per_s": s.bandwidth, "rewrites": rewrite_rows, "model": model_rows,
        "targets": targets(model_rows, rewrite_rows), "errors": errors,
        "seconds": time.perf_counter() - started}
    dirs = [] if args.no_record else [_HERE / "results"]
    out = args.out or os.environ.get("OUT")
    if out:
        dirs.append(Path(out))
    if dirs:
        for p in write_outputs(payload, dirs):
            log(f"wrote {p}")
    # the final tables, last, as markdown (readable in a log, never clipped to a terminal width)
    print(f"\n{payload['env']}\n\nrewrites\n" + T.markdown_table(rewrite_rows, COLUMNS))
    print("hybrid model\n" + T.markdown_table(model_rows, MODEL_COLUMNS))
    print(f"targets ({payload['seconds']:.0f} s)\n" + T.markdown_table(payload["targets"], TARGET_COLUMNS))
    for e in errors:
        print(f"error: {e}")
    return payload


if __name__ == "__main__":
    main()
