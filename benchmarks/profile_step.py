"""Where a hybrid-model step's time goes, stock vs kda_inductor, on a GPU.

    python -m benchmarks.profile_step                    # the T=256 spec-decode step
    python -m benchmarks.profile_step --step prefill     # the 16K-token prefill
    python -m benchmarks.profile_step --only-each        # also: one rewrite enabled at a time
    python -m benchmarks.profile_step --without-each     # also: one rewrite disabled at a time
    python -m benchmarks.profile_step --twice --without gdn_spec_split --one-sided-split

For one step of the hybrid model (real dims, flash-linear-attention's core where installed):

* **variants**: CUDA-graph replay medians of stock ``torch.compile`` (the cache write run
  eagerly where stock Inductor cannot compile it, as ``benchmarks.report`` does), of
  kda_inductor, and with ``--only-each`` of kda_inductor with only one rewrite enabled: the
  step-level saving each rewrite buys in the model, to set against its isolated benchmark;
  with ``--without-each`` with one rewrite disabled: what each rewrite adds to the others
  (the measurement behind a speed rule: a rewrite that fires must not make the step slower);
  ``--without NAME`` for chosen ones; ``--twice``: kda compiled and timed a second time (the
  spread between two compiles of the same code: differences under it are noise);
  ``--one-sided-split``: kda with ``gdn_spec_split``'s one-sided launches fused (the rule
  that leaves them to Inductor turned off);
* **in the graph**: a ``torch.profiler`` trace of a few replays of each variant's CUDA
  graph: the sum of its kernels' times and the span from the first kernel's start to the
  last one's end (their difference: the gaps between kernels in the replay);
* **kernels**: a ``torch.profiler`` trace of a few steps of stock and of kda, the GPU time
  per step of every kernel name (Inductor's generated kernels are named after the ops they
  fuse), both lists side by side and their totals; the kernel count per step.

Writes ``profile_<step>.json`` to ``$OUT`` (or ``--out``) when set. Times are the GPU's own.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

_HERE = Path(__file__).resolve().parent
for p in (str(_HERE), str(_HERE.parent / "examples"), str(_HERE.parent)):
    if p not in sys.path:
        sys.path.insert(0, p)

import _timing as T  # noqa: E402

from kda_inductor import REWRITE_NAMES  # noqa: E402


def log(msg: str) -> None:
    print(f"[profile {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def compile_variant(model, batch, options: dict | None, eager_write: bool):
    """A compiled model that has run one step (compiled, caches off)."""
    import hybrid_model as HM

    model.attn.eager_write = eager_write
    torch._dynamo.reset()
    backend = "inductor" if options is None else "kda_inductor"
    fn = torch.compile(model, backend=backend, **({} if options is None else {"options": {"kda": options}}))
    from kda_inductor import pass_manager

    t0 = time.perf_counter()
    with torch._inductor.config.patch(force_disable_caches=True), pass_manager.counted() as got:
        HM.run_step(model, batch, fn)
    log(f"compiled {backend} {options or ''} in {time.perf_counter() - t0:.0f} s; rewrites {got}")
    return fn


def compile_stock(model, batch):
    """Stock torch.compile of the model and whether its cache write runs eagerly: where stock
    Inductor cannot compile the write ("view Float as Byte" on some GPUs), behind a graph break."""
    try:
        return compile_variant(model, batch, None, False), False
    except Exception as e:  # noqa: BLE001
        log(f"stock fails with the write in the graph ({type(e).__name__}); the write runs eagerly")
        return compile_variant(model, batch, None, True), True


def capture(model, fn, args, kwargs):
    """One step of ``fn`` captured in a CUDA graph (replayed later, alternating with the other
    variants, so that clock drift over the run does not favour whichever ran first)."""
    with torch.no_grad():
        cache = model.attn.kv_cache.clone()
        graph, out = T.capture_graph(lambda: fn(*args, **kwargs))
        model.attn.kv_cache.copy_(cache)
    return graph, out


def kernel_times(model, fn, args, kwargs, steps: int = 5) -> dict[str, tuple[float, int]]:
    """GPU microseconds and launches per step of each kernel name."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        cache = model.attn.kv_cache.clone()
        for _ in range(2):
            fn(*args, **kwargs)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                fn(*args, **kwargs)
            torch.cuda.synchronize()
        model.attn.kv_cache.copy_(cache)
    out: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for e, dur in _gpu_events(prof):
        out[e.name][0] += dur / steps
        out[e.name][1] += 1
    return {k: (v[0], v[1] // steps) for k, v in out.items()}


def _gpu_events(prof) -> list[tuple]:
    """``(event, GPU microseconds)`` of each kernel (and copy) a profile traced."""
    out = []
    for e in prof.events():
        if getattr(e, "device_type", None) != torch.autograd.DeviceType.CUDA:
            continue
        dur = getattr(e, "device_time", None)
        out.append((e, getattr(e, "cuda_time", 0.0) if dur is None else dur))
    return out


def replay_profile(graph, replays: int = 3) -> dict:
    """Medians over ``replays`` single replays of ``graph`` under ``torch.profiler``: the sum of
    its kernels' GPU times, the span from the first kernel's start to the last one's end, and
    the kernel count (every kernel node of the graph is traced)."""
    from torch.profiler import ProfilerActivity, profile

    graph.replay()
    torch.cuda.synchronize()
    busy, span, count = [], [], []
    for _ in range(replays):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            graph.replay()
            torch.cuda.synchronize()
        ks = _gpu_events(prof)
        if not ks:
            return {"kernels_us": float("nan"), "span_us": float("nan"), "launches": 0}
        busy.append(sum(dur for _, dur in ks))
        span.append(max(e.time_range.end for e, _ in ks) - min(e.time_range.start for e, _ in ks))
        count.append(len(ks))
    return {"kernels_us": statistics.median(busy), "span_us": statistics.median(span),
            "launches": int(statistics.median(count))}


def side_by_side(stock: dict, kda: dict, top: int) -> str:
    def rows(d):
        return sorted(d.items(), key=lambda kv: -kv[1][0])[:top]

    lines = [f"{'stock kernel':70s} {'us':>8s} {'n':>3s} | {'kda kernel':70s} {'us':>8s} {'n':>3s}"]
    a, b = rows(stock), rows(kda)
    for i in range(max(len(a), len(b))):
        left = f"{a[i][0][:70]:70s} {a[i][1][0]:8.1f} {a[i][1][1]:3d}" if i < len(a) else " " * 83
        right = f"{b[i][0][:70]:70s} {b[i][1][0]:8.1f} {b[i][1][1]:3d}" if i < len(b) else ""
        lines.append(f"{left} | {right}")
    for label, d in (("stock", stock), ("kda", kda)):
        lines.append(f"{label}: {sum(v[0] for v in d.values()):.1f} us of kernels per step, "
                     f"{sum(v[1] for v in d.values())} launches")
    return "\n".join(lines)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--step", choices=("spec", "prefill"), default="spec")
    p.add_argument("--T", type=int, help="tokens (default: 256 spec, 16384 prefill)")
    p.add_argument("--only-each", action="store_true", help="also time kda with one rewrite enabled at a time")
    p.add_argument("--without-each", action="store_true", help="also time kda with one rewrite disabled at a time")
    p.add_argument("--without", action="append", default=[], choices=REWRITE_NAMES, metavar="NAME",
                   help="also time kda with this rewrite disabled (repeatable)")
    p.add_argument("--twice", action="store_true", help="also time a second compile of kda")
    p.add_argument("--one-sided-split", action="store_true",
                   help="also time kda with gdn_spec_split's one-sided launches fused")
    p.add_argument("--rounds", type=int, default=3, help="alternating replay rounds per variant")
    p.add_argument("--top", type=int, default=40, help="kernels listed per side")
    p.add_argument("--out", help="write profile_<step>.json here (default: $OUT when set)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    import hybrid_model as HM

    T_ = args.T or (256 if args.step == "spec" else 16384)
    model = HM.make_model(HM.HybridConfig(), device="cuda")
    batch = HM.spec_decode_batch(model, T_) if args.step == "spec" else HM.prefill_batch(model, T_)
    a, kw = batch.args(), batch.kwargs()
    HM.run_step(model, batch)  # eager first: fla's autotuning is not counted in a compile
    result: dict = {"step": args.step, "T": T_, "env": T.environment_info(), "replay_us": {}, "kernels": {}}
    captured = {}  # (graph, output): the output lives as long as its graph

    def add(label, fn):  # captured right after its compile: the next compile resets Dynamo
        captured[label] = capture(model, fn, a, kw)
        result["kernels"][label] = kernel_times(model, fn, a, kw)

    stock, eager_write = compile_stock(model, batch)
    add("stock", stock)
    variants = {"kda": ({}, False)}
    if args.only_each:
        for name in REWRITE_NAMES:
            variants[f"only {name}"] = ({"disable": [r for r in REWRITE_NAMES if r != name]},
                                        eager_write and name != "indexer_k_write")
    if args.twice:
        variants["kda (2nd compile)"] = ({}, False)
    for name in REWRITE_NAMES if args.without_each else args.without:
        # without the write rewrite the write runs as stock runs it
        variants[f"without {name}"] = ({"disable": [name]}, eager_write and name == "indexer_k_write")
    if args.one_sided_split:
        variants["kda, one-sided splits fused"] = ({}, False)
    from kda_inductor.patterns import gdn_spec_split

    for label, (options, ew) in variants.items():
        rule = gdn_spec_split.ONE_SIDED_TO_INDUCTOR
        gdn_spec_split.ONE_SIDED_TO_INDUCTOR = rule and label != "kda, one-sided splits fused"
        try:
            add(label, compile_variant(model, batch, options, ew))
        finally:
            gdn_spec_split.ONE_SIDED_TO_INDUCTOR = rule
    cache = model.attn.kv_cache.clone()
    result["in_graph"] = {}
    for label, (graph, _) in captured.items():
        result["in_graph"][label] = replay_profile(graph)
    samples = T.alternating_replay_us({label: g for label, (g, _) in captured.items()}, rounds=args.rounds)
    model.attn.kv_cache.copy_(cache)
    for label, xs in samples.items():
        result["replay_us"][label] = statistics.median(xs)
        log(f"{label}: {result['replay_us'][label]:.1f} us per step (replay rounds {[round(x, 1) for x in xs]})")
    model.attn.eager_write = False
    print(f"\n{result['env']}\n{args.step} step, T={T_}\n")
    base = result["replay_us"]["stock"]
    for label, us in result["replay_us"].items():
        print(f"{label:28s} {us:9.1f} us   stock - this {base - us:8.1f} us")
    print()
    for label, g in result["in_graph"].items():
        print(f"{label:28s} in the graph: kernels {g['kernels_us']:9.1f} us, span {g['span_us']:9.1f} us, "
              f"gaps {g['span_us'] - g['kernels_us']:7.1f} us, {g['launches']} kernels")
    print()
    for label, ks in result["kernels"].items():
        print(f"{label:28s} kernels {sum(v[0] for v in ks.values()):9.1f} us, {sum(v[1] for v in ks.values())} launches")
    print()
    print(side_by_side(result["kernels"]["stock"], result["kernels"]["kda"], args.top))
    out = args.out or os.environ.get("OUT")
    if out:
        path = Path(out) / f"profile_{args.step}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1, default=str))
        log(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
