"""What our pass costs at compile time, on any device: ``python -m benchmarks.bench_compile_time``.

Cold compiles (``torch._dynamo.reset()``, every Inductor cache disabled) of the example layers
and of the hybrid model's spec-decode step, each ``--repeats`` times (median):

* ``stock``: ``torch.compile(backend="inductor")``;
* ``kda``: ``backend="kda_inductor"`` as a user runs it (no tool watching: no graph
  snapshots, no logging); on CPU its speed rules leave every match to Inductor, so this is
  the cost of looking;
* ``kda observed``: the same under ``kda_inductor.pass_manager.observe()`` (what ``explain()``,
  ``graph-diff``, the HTML report and the pytest plugin turn on: text and node snapshots of
  every graph);
* ``kda forced``: ``options={"kda": {"force": True}}``: every match rewritten (on CPU the
  fused ops' CPU implementations).

Our pass's own time is measured inside each compile (``pass_manager.timed``).
The bars: the pass adds < 10% to the model's compile, and the tools
cost nothing when unused (``kda`` vs ``stock`` within noise). Writes
``benchmarks/results/compile_time_<device>.md`` / ``.json`` unless ``--no-record``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

_HERE = Path(__file__).resolve().parent
for p in (str(_HERE.parent / "examples"), str(_HERE.parent)):
    if p not in sys.path:
        sys.path.insert(0, p)

VARIANTS = ("stock", "kda", "kda observed", "kda forced")


def targets(device: str):
    """``name -> (fn, args, kwargs, restore)``: what one compile runs once."""
    import gdn_layers as G
    import hybrid_model as HM
    import indexer_block as IB

    out = {}
    for name, build in (("gdn layer", G.build_gdn), ("kda layer", G.build_kda)):
        layer, args = build()
        out[name] = (layer.to(device), [a.to(device) if isinstance(a, torch.Tensor) else a for a in args], {}, None)
    block, args = IB.build()
    out["indexer block"] = (block, args, {}, None)
    model = HM.make_model(HM.HybridConfig.tiny(), device=device, core="torch")
    batch = HM.spec_decode_batch(model, 24, seed=0)
    cache = model.attn.kv_cache.clone()
    out["hybrid model (tiny, spec step)"] = (model, batch.args(), batch.kwargs(),
                                             lambda m=model, c=cache: m.attn.kv_cache.copy_(c))
    return out


def compile_once(fn, args, kwargs, variant: str) -> tuple[float, float]:
    """Seconds of one cold compile + first call, and of our pass inside it."""
    from kda_inductor import pass_manager

    torch._dynamo.reset()
    if variant == "stock":
        compiled = torch.compile(fn, backend="inductor")
    else:
        compiled = torch.compile(fn, backend="kda_inductor",
                                 options={"kda": {"force": True}} if variant == "kda forced" else None)
    watch = pass_manager.observe() if variant == "kda observed" else contextlib.nullcontext()
    with torch.no_grad(), torch._inductor.config.patch(force_disable_caches=True), watch, \
            pass_manager.timed() as spent:
        t0 = time.perf_counter()
        compiled(*args, **kwargs)
        total = time.perf_counter() - t0
    return total, sum(spent)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", help="substring of a target's name")
    ap.add_argument("--no-record", action="store_true")
    a = ap.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*dynamo_pgo force disabled.*")
    rows = []
    for name, (fn, args, kwargs, restore) in targets(a.device).items():
        if a.only and a.only not in name:
            continue
        with torch.no_grad():  # warm: eager once (kernel builds and autotuning are not ours to count)
            fn(*args, **kwargs)
        compile_once(fn, args, kwargs, "stock")  # and one compile (imports, first-use setup), not counted
        if restore:
            restore()
        row = {"target": name}
        for variant in VARIANTS:
            runs = []
            for _ in range(a.repeats):
                runs.append(compile_once(fn, args, kwargs, variant))
                if restore:
                    restore()
            row[variant] = statistics.median(t for t, _ in runs)
            row[f"{variant} pass"] = statistics.median(p for _, p in runs)
            print(f"{name}: {variant} {row[variant]:.2f} s (our pass {row[variant + ' pass']:.3f} s)",
                  file=sys.stderr, flush=True)
        row["pass share"] = row["kda pass"] / row["kda"]
        row["kda over stock"] = row["kda"] / row["stock"] - 1
        row["observed over kda"] = row["kda observed"] / row["kda"] - 1
        rows.append(row)
    dev = torch.cuda.get_device_name() if a.device == "cuda" else f"CPU ({platform.processor() or platform.machine()})"
    head = (f"Cold compile + first call, median of {a.repeats}, {datetime.date.today()}, {dev}, "
            f"torch {torch.__version__}, python {platform.python_version()}.")
    lines = [head, "", "| target | stock s | kda s | kda +% | our pass s | pass share | observed s | observed +% "
             "| forced s |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['target']} | {r['stock']:.2f} | {r['kda']:.2f} | {r['kda over stock']:+.1%} | "
                     f"{r['kda pass']:.3f} | {r['pass share']:.1%} | {r['kda observed']:.2f} | "
                     f"{r['observed over kda']:+.1%} | {r['kda forced']:.2f} |")
    text = "\n".join(lines)
    print(text)
    if not a.no_record:
        out = _HERE / "results" / f"compile_time_{a.device}"
        out.with_suffix(".md").write_text(text + "\n")
        out.with_suffix(".json").write_text(json.dumps({"header": head, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
