"""Where a transformers hybrid model's step spends its GPU time, eager against compiled:
``python -m benchmarks.hf_profile --family qwen3_next --case prefill [--variant eager,stock,kda]``.

Builds the model as ``benchmarks.hf_models`` does, runs the case under ``torch.profiler`` (CUDA
activity, a few calls after warm-up), and writes per variant: the step's GPU time, its kernels
grouped by kind (Inductor's generated Triton, fla-core's Triton, GEMMs, attention, copies, other)
and the top kernels by total time; for compiled variants the graph count and graph breaks
(``torch._dynamo.utils.counters``) and the compile time. Also notes what transformers picked
(the MoE experts implementation, the recurrent and conv cores). Results:
``benchmarks/results/hf_profile_<family>_<case>.{md,json}`` (why stock loses to eager).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import time

import torch

from benchmarks import _timing, hf_models

KINDS = [  # (kind, regex on the kernel name), first match wins
    ("inductor triton", r"^triton_|^triton_poi|^triton_red|^triton_per"),
    ("gemm", r"gemm|nvjet|xmma|cutlass|sm90_|sm100_|cublas|grouped_mm|wgmma"),
    ("attention", r"flash|fmha|attention|sdpa|efficient"),
    ("fla / user triton", r"chunk|fused_recurrent|l2norm|solve_tril|wy_fast|cumsum|kda|gated_delta|fwd_kernel"),
    ("conv", r"conv"),
    ("copy / fill", r"copy|Memcpy|Memset|fill|cat|index|gather|scatter|elementwise|vectorized|reduce"),
]


def kind_of(name: str) -> str:
    for kind, pattern in KINDS:
        if re.search(pattern, name, re.IGNORECASE):
            return kind
    return "other"


def profile(fn, *, calls: int = 3) -> dict:
    """GPU kernel times of ``calls`` calls of ``fn`` (after two warm-up calls), per call."""
    per_kernel = _timing.kernel_profile(fn, calls=calls, warmup=2)
    kinds: dict[str, float] = collections.Counter()
    for name, (us, _) in per_kernel.items():
        kinds[kind_of(name)] += us
    top = sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[:25]
    return {"gpu_us": sum(us for us, _ in per_kernel.values()), "launches": sum(n for _, n in per_kernel.values()),
            "kinds": dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
            "top": [{"kernel": k[:110], "us": round(us, 1), "calls": n, "kind": kind_of(k)} for k, (us, n) in top]}


def _qualified(fn) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}"


def picked(model, modeling) -> dict:
    """What transformers chose for this model's hot paths."""
    out = {"experts_implementation": getattr(model.config, "_experts_implementation", None)}
    for name in ("chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "causal_conv1d_fn",
                 "causal_conv1d_update", "chunk_kda", "fused_recurrent_kda"):
        fn = getattr(modeling, name, None)
        if fn is not None:
            out[name] = _qualified(fn)
    for mod in model.modules():  # the layers hold their own chosen cores
        for name in ("chunk_gated_delta_rule", "causal_conv1d_fn", "chunk_kda"):
            fn = getattr(mod, name, None)
            if fn is not None and f"layer.{name}" not in out:
                out[f"layer.{name}"] = _qualified(fn)
    return out


def _kda_variant(variant: str, decoder, call):
    """``kda``, ``kda-no-<rewrite>`` and/or ``-nofix`` compiled and called once (a bisect of what
    our backend changes: a rewrite, or the Dynamo fix of ``kda_inductor/_dynamo_fixes.py``):
    ``(step, explain() report)``."""
    from unittest import mock

    from kda_inductor import _dynamo_fixes

    m = re.fullmatch(r"kda(?:-no-(\w+?))?(-nofix)?", variant)
    if m is None:
        raise SystemExit(f"--variant: unknown {variant!r} (eager, stock, kda, kda-no-<rewrite>, kda-nofix)")
    options = {"kda": {"disable": [m.group(1)]}} if m.group(1) else None
    fix = mock.patch.object(_dynamo_fixes, "our_options", lambda tx: None) if m.group(2) else mock.MagicMock()
    with fix:
        fn, report = hf_models.kda_compile(decoder, call, options)
        fn()
    return fn, report


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--family", default="qwen3_next", choices=sorted(hf_models.BY_NAME))
    parser.add_argument("--case", default="prefill", choices=["decode32", "decode128", "prefill"])
    parser.add_argument("--variant", default="eager,stock",
                        help="comma list of eager, stock, kda; bisecting: kda-no-<rewrite> (that rewrite "
                             "disabled), kda-nofix (the Dynamo is_exporting fix off), combinable: kda-no-X-nofix")
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--code-dir", default=None,
                        help="write each compiled variant's generated code (Inductor's output modules) to "
                             "CODE_DIR/<variant>/ (a fresh Inductor cache dir per variant, caches off)")
    args = parser.parse_args(argv)
    family = hf_models.BY_NAME[args.family]
    model, config = hf_models.build(family, tiny=False, device="cuda")
    modeling = hf_models.load(family)[2]
    if args.case == "prefill":
        call, reset = hf_models.prefill_case(model, config, tokens=args.tokens, device="cuda")
    else:
        call, reset = hf_models.decode_case(model, config, batch=int(args.case[6:]), context=256, device="cuda")
    decoder = model.model
    result = {"family": family.name, "case": args.case, "picked": picked(model, modeling), "variants": {}}
    print(json.dumps(result["picked"], indent=1), flush=True)
    with torch.inference_mode():
        for variant in args.variant.split(","):
            torch._dynamo.reset()
            torch._dynamo.utils.counters.clear()
            reset()
            if args.code_dir:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.abspath(os.path.join(args.code_dir, variant))
                torch._inductor.config.force_disable_caches = True
            t0 = time.perf_counter()
            report = None
            if variant == "eager":
                fn = lambda: call(decoder)  # noqa: E731
            elif variant == "stock":
                compiled = torch.compile(decoder, backend="inductor")
                fn = lambda: call(compiled)  # noqa: E731
                fn()
            else:
                fn, report = _kda_variant(variant, decoder, call)
            torch.cuda.synchronize()
            entry = {"compile_s": round(time.perf_counter() - t0, 1)}
            counters = torch._dynamo.utils.counters
            entry["graphs"] = dict(counters["stats"]).get("unique_graphs")
            entry["graph_breaks"] = {k[:200]: v for k, v in counters["graph_break"].items()}
            if report is not None:
                entry["matches"] = {k: v for k, v in report.matches.items() if v}
                entry["misses"] = [line.strip() for line in report.misses_text() if line.strip()]
                entry["obstacles"] = report.obstacles()
            entry.update(profile(fn))
            entry["events_us"] = _timing.eager_median_us(fn, reps=5, warmup=1)
            result["variants"][variant] = entry
            print(f"== {variant}: gpu {entry['gpu_us']:.0f} us/call, {entry['launches']} launches, "
                  f"events {entry['events_us']:.0f} us, compile {entry['compile_s']} s, graphs {entry['graphs']}, "
                  f"breaks {sum(entry['graph_breaks'].values())}", flush=True)
            for reason, n in entry["graph_breaks"].items():
                print(f"   break x{n}: {reason}")
            if report is not None:
                print(f"   rewrites: {entry['matches']}")
                print("\n".join(f"   miss: {m}" for m in entry["misses"]))
                print("   " + entry["obstacles"].replace("\n", "\n   "))
            for kind, us in entry["kinds"].items():
                print(f"   {kind:20s} {us:9.0f} us")
            for row in entry["top"]:
                print(f"   {row['us']:9.1f} us x{row['calls']:<4} [{row['kind']}] {row['kernel']}")
    import transformers

    result["env"] = {**_timing.environment_info(), "transformers": transformers.__version__}
    name = f"hf_profile_{family.name}_{args.case}"
    (hf_models.RESULTS / f"{name}.json").write_text(json.dumps(result, indent=1))
    (hf_models.RESULTS / f"{name}.md").write_text(markdown(result))
    print(f"wrote {hf_models.RESULTS / name}.{{json,md}}")


def markdown(result: dict) -> str:
    env = result["env"]
    lines = [f"# where {result['family']} {result['case']} spends its GPU time", "",
             f"{env.get('date', '')}; GPU: {env.get('gpu', '')}; torch {env.get('torch', '')}; "
             f"triton {env.get('triton', '')}; transformers {env.get('transformers', '')}", "",
             "transformers picked: " + ", ".join(f"`{k}` = `{v}`" for k, v in result["picked"].items()), "",
             "| variant | GPU us / call | launches | events us | compile s | graphs | graph breaks |"
             + "".join(f" {k} us |" for k, _ in KINDS) + " other us |",
             "|---|---|---|---|---|---|---|" + "---|" * (len(KINDS) + 1)]
    for name, v in result["variants"].items():
        kinds = [v["kinds"].get(k, 0.0) for k, _ in KINDS] + [v["kinds"].get("other", 0.0)]
        lines.append(f"| {name} | {v['gpu_us']:.0f} | {v['launches']} | {v['events_us']:.0f} | {v['compile_s']} | "
                     f"{v['graphs']} | {sum(v['graph_breaks'].values())} |" + "".join(f" {x:.0f} |" for x in kinds))
    for name, v in result["variants"].items():
        lines += ["", f"## {name}: top kernels", "", "| us / call | calls | kind | kernel |", "|---|---|---|---|"]
        lines += [f"| {r['us']} | {r['calls']} | {r['kind']} | `{r['kernel']}` |" for r in v["top"][:15]]
        lines += [f"- graph break x{n}: {reason}" for reason, n in v["graph_breaks"].items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
