"""What users run: ``model.generate()`` of transformers' hybrid families with the compiled
forward, tokens per second for eager, stock ``torch.compile`` and ``kda_inductor``:
``python -m benchmarks.hf_generate`` (GPU), ``--smoke`` (CPU, tiny config, few tokens).

transformers documents one way to compile generation (its docs' "LLM optimizations" and "KV cache"
pages, 5.17-5.25; ``GenerationMixin._valid_auto_compile_criteria``): pass a fixed-size
cache, ``cache_implementation="static"``, and ``generate`` compiles the model's forward itself
for the decoding steps (``PreTrainedModel.get_compiled_call``: ``torch.compile(self.__call__,
**compile_config.to_dict())``; the prefill runs uncompiled), with ``CompileConfig`` choosing the
backend and mode (default ``mode="reduce-overhead"``: CUDA graphs); "avoid calling
``torch.compile(model)`` outside of generate". So the variants are:

- eager: ``generate()`` as it comes (the default dynamic cache, nothing compiled);
- stock: ``cache_implementation="static"``, ``compile_config=CompileConfig(backend="inductor")``;
- kda: the same with ``CompileConfig(backend="kda_inductor")``; ``kda@with-NAME`` with rewrite NAME
  on where its speed rule would leave it (``benchmarks/_hf_sched.py``'s modifiers, as ``hf_models``
  takes them: e.g. ``kda@with-moe_grouped_experts``).

The model is ``benchmarks.hf_models``'s: the released per-layer dims, 4 layers, 16 experts,
bf16, random weights from the config (no download), a 4096-token vocabulary; prompts of
``--prompt`` random tokens, batch 1 and 32, ``--new-tokens`` 128 greedy tokens (no EOS: the
config has none; ``min_new_tokens`` keeps the count). Each (family, batch, variant) runs in a
fresh process twice: first on an empty Inductor cache (cold), then reading it (warm: a
restarted server). A process times its first ``generate`` (the compiles), then ``--reps``
more; tokens/s = batch x new tokens / the median of those. Recorded with the graphs compiled
and recompiles (a recompile per step would be the user's real cost), in
``benchmarks/results/hf_generate.{json,md}``, one section per commit (``_hf_record``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

_HERE = Path(__file__).resolve().parent
if str(_HERE.parent) not in sys.path:
    sys.path.insert(0, str(_HERE.parent))

from benchmarks import _hf_record, _hf_sched, _timing, hf_models  # noqa: E402

VARIANTS = ("eager", "stock", "kda")
BACKENDS = {"stock": "inductor", "kda": "kda_inductor"}
TITLE = "transformers generate()"
INTRO = ("`python -m benchmarks.hf_generate`: `model.generate()` with the forward compiled as transformers "
         "documents it (a static cache, `compile_config=CompileConfig(backend=...)`), tokens/s. One section per "
         "run at one commit, rendered from `hf_generate.json` between its markers.")


def generate_kwargs(variant: str, *, new_tokens: int, smoke: bool) -> dict[str, Any]:
    """``generate()``'s keywords for a variant (greedy, exactly ``new_tokens`` tokens)."""
    kw: dict[str, Any] = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": False,
                          "pad_token_id": 0}
    if variant == "eager":
        return kw
    from transformers import CompileConfig

    config = CompileConfig(backend=BACKENDS[_hf_sched.base_variant(variant)], **({"mode": "default"} if smoke else {}))
    if smoke:  # generate compiles only on accelerators unless told otherwise (a private switch)
        config._compile_all_devices = True
    return {**kw, "cache_implementation": "static", "compile_config": config}


def run_one(spec: dict[str, Any]) -> dict[str, Any]:
    """One process's measurement: build, the first generate (compiles), ``reps`` timed ones."""
    from torch._dynamo.utils import counters

    smoke, device = spec["smoke"], spec["device"]
    refused = _hf_sched.apply_modifiers(spec["variant"])  # kda@with-NAME: a forced-only rewrite on
    if refused:
        return {"error": refused}
    family = hf_models.BY_NAME[spec["family"]]
    # --jobs > 1: the run's GPU lock held except while Dynamo compiles (benchmarks/_hf_sched.py); the
    # quiet lock held shared by all CPU work of the run but timings (the build here, the compiles), held
    # exclusively by a timing (generate() is host-bound): see QuietLock on why the build is under it
    lock = _hf_sched.GpuLock(spec.get("gpu_lock"))
    quiet = _hf_sched.QuietLock(spec.get("quiet_lock"))
    with quiet.shared_during():
        built = hf_models.build(family, tiny=smoke, device=device,
                                dtype=torch.float32 if smoke else torch.bfloat16,
                                layers=hf_models.SMOKE_LAYERS if smoke else hf_models.N_LAYERS)
    if built is None:
        return {"error": "not in this transformers"}
    model, config = built
    gen = torch.Generator(device="cpu").manual_seed(3)
    prompt = torch.randint(0, config.vocab_size, (spec["batch"], spec["prompt"]), generator=gen).to(device)
    kw = generate_kwargs(spec["variant"], new_tokens=spec["new_tokens"], smoke=smoke)
    counters.clear()

    def once(**over) -> tuple[float, torch.Tensor]:
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(prompt, **{**kw, **over})
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0, out

    # the first generate's time is what a user waits, less the time this process queued for the GPU;
    # the timed generates run with no other process building or compiling (the quiet lock)
    from kda_inductor import pass_manager

    with _hf_sched.outside_compiles(lock, quiet), pass_manager.observe() as passes:
        waited = lock.waited + quiet.waited
        first_s, out = once()
        first_s -= lock.waited + quiet.waited - waited
        graphs = counters["stats"].get("unique_graphs")
        with quiet.exclusive():
            times = [once()[0] for _ in range(spec["reps"])]
            profiled = where_time_goes(once, device) if spec.get("profile") else None
            recompiles = _recompiles(counters)
            # the prompt's forward alone (a one-token generate: no decoding step, the static cache reused),
            # timed last so that it cannot move the figures above: what a token of decoding costs
            prefill = statistics.median(once(max_new_tokens=1, min_new_tokens=1)[0] for _ in range(spec["reps"]))
    lock.release()
    new = out.shape[1] - prompt.shape[1]
    med = statistics.median(times)
    return {"first_s": first_s, "times_s": times, "s": med, "new_tokens": new,
            "tokens_per_s": spec["batch"] * new / med, "graphs_first": graphs, "prefill_s": prefill,
            "decode_ms_per_token": (med - prefill) / (new - 1) * 1e3 if new > 1 else None,
            "prefill_recompiled": _recompiles(counters) != recompiles,
            "graphs": counters["stats"].get("unique_graphs"), "recompiles": recompiles,
            "compiled": hasattr(model, "_compiled_call"), "tokens": out[:, prompt.shape[1]:][:2, :8].tolist(),
            # what our pass replaced in the graphs it ran on (none where a warm cache served the code)
            "pass_graphs": len(passes), "rewrites": {k: n for k, n in pass_manager.total_matches(passes).items() if n},
            **({"profile": profiled} if profiled else {})}


def where_time_goes(once, device: str, top: int = 12) -> dict[str, Any]:
    """One more generate under ``torch.profiler``: its wall time, the GPU's busy time (the kernels'
    own time, CUDA-graph replays' kernels included where CUPTI sees them), the host's time in
    operators, and the operators with the most host self time and the most GPU time: whether a token's time is the
    model's step or generate's own loop."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        wall, _ = once()
    events = prof.key_averages()

    def dev(e) -> float:  # the attribute's name moved in torch 2.4
        return float(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0)) or 0.0)

    # kernels only: an operator's or a compiled graph's row carries its kernels' time again
    kernels = [e for e in events if dev(e) > 0 and str(getattr(e, "device_type", "")).endswith(("CUDA", "PrivateUse1"))]
    ranked = sorted(events, key=lambda e: -e.self_cpu_time_total)[:top]
    on_gpu = sorted(kernels, key=lambda e: -dev(e))[:top]
    return {"wall_s": wall, "gpu_busy_s": sum(dev(e) for e in kernels) / 1e6,
            "host_ops_s": sum(e.self_cpu_time_total for e in events) / 1e6,
            "top_host": [{"op": e.key[:90], "self_ms": round(e.self_cpu_time_total / 1e3, 3), "calls": e.count}
                         for e in ranked],
            "top_device": [{"op": e.key[:90], "self_ms": round(dev(e) / 1e3, 3), "calls": e.count} for e in on_gpu]}


def _recompiles(counters) -> int:
    """Dynamo's recompiles so far (its frames compiled more than once)."""
    return int(sum(v for k, v in counters["recompiles"].items())) if "recompiles" in counters else 0


def _spawn(spec: dict[str, Any], env: dict[str, str], timeout: float) -> dict[str, Any]:
    """``run_one(spec)`` in a fresh process with ``env`` (its Inductor cache)."""
    with tempfile.TemporaryDirectory(prefix="hf_gen_") as tmp:
        spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec_path.write_text(json.dumps({**spec, "out": str(out_path)}))
        full_env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join(filter(None, [str(_HERE.parent),
                                                                                     os.environ.get("PYTHONPATH")]))}
        try:
            proc = subprocess.run([sys.executable, "-m", "benchmarks.hf_generate", "--worker", str(spec_path)],
                                  env=full_env, cwd=_HERE.parent, capture_output=True, text=True,
                                  timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            return {"error": f"killed after {timeout:.0f} s"}
        if proc.returncode != 0 or not out_path.exists():
            tail = (proc.stdout + proc.stderr)[-2500:]
            print(tail, flush=True)
            return {"error": f"exit {proc.returncode}: {tail.strip().splitlines()[-1][:300] if tail.strip() else ''}"}
        return json.loads(out_path.read_text())


def summarize(records: list[dict]) -> list[dict]:
    """One row per (family, batch, variant): tokens/s cold and warm, and against stock."""
    rows: dict[tuple, dict] = {}
    for r in records:
        row = rows.setdefault((r["family"], r["case"], r["variant"]),
                              {"family": r["family"], "case": r["case"], "variant": r["variant"]})
        row[f"{r['cache']}_tps"] = r.get("tokens_per_s")
        row[f"{r['cache']}_first_s"] = r.get("first_s")
        row[f"{r['cache']}_decode_ms"] = r.get("decode_ms_per_token")
        if r.get("prefill_s") is not None and (r["cache"] == "cold" or row.get("prefill_ms") is None):
            row["prefill_ms"] = r["prefill_s"] * 1e3
        row[f"{r['cache']}_graphs"] = f"{r.get('graphs')} ({r.get('recompiles')} recompiles)" \
            if r.get("graphs") is not None else None
        prof = r.get("profile")
        shown = r["cache"] == "warm" or r["variant"] == "eager"
        if prof and prof.get("wall_s") and prof.get("gpu_busy_s") is not None and shown:
            row["gpu_busy"] = prof["gpu_busy_s"] / prof["wall_s"]
        if r.get("error"):
            row["error"] = r["error"][:160]
    out = list(rows.values())
    for row in out:
        stock = rows.get((row["family"], row["case"], "stock"), {})
        for cache in ("cold", "warm"):
            a, b = row.get(f"{cache}_tps"), stock.get(f"{cache}_tps")
            row[f"{cache}_vs_stock"] = a / b if a and b and row["variant"] != "stock" else None
    return out


COLUMNS = [("family", "family", ""), ("case", "case", ""), ("variant", "variant", ""),
           ("cold_tps", "tokens/s (cold cache)", ".1f"), ("cold_vs_stock", "/ stock", ".3f"),
           ("warm_tps", "tokens/s (warm cache)", ".1f"), ("warm_vs_stock", "/ stock", ".3f"),
           ("prefill_ms", "prompt's forward ms (cold)", ".1f"), ("cold_decode_ms", "decode ms / token (cold)", ".2f"),
           ("warm_decode_ms", "decode ms / token (warm)", ".2f"),
           ("cold_first_s", "first generate s (cold)", ".1f"), ("warm_first_s", "first generate s (warm)", ".1f"),
           ("cold_graphs", "graphs (cold)", ""),
           ("gpu_busy", "GPU busy / wall (--profile; warm)", ".2f"), ("error", "error", "")]


GPU_SPEC = {"prompt": 32, "new_tokens": 128, "reps": 3}
"""What a GPU run measures unless told otherwise (a call records its own: ``call["spec"]``)."""


def section_markdown(section: dict[str, Any], spec: dict[str, Any] | None = None) -> str:
    """The section's page: its calls, what one generate was (``spec``, else its newest call's), the table."""
    spec = spec or next((c["spec"] for c in reversed(section.get("calls", [])) if c.get("spec")), GPU_SPEC)
    lines = [_hf_record.heading(section), ""]
    if not section["env"].get("gpu"):
        lines += ["A CPU smoke run (tiny dims, 2 layers): the numbers mean nothing.", ""]
    lines += [f"- call {c['started']} (`{' '.join(c.get('argv', []))}`)" for c in section.get("calls", [])]
    lines += ["", f"Prompt {spec['prompt']} random tokens, {spec['new_tokens']} new greedy tokens, median of "
              f"{spec['reps']} generates after the first (which compiles); cold: a process on an empty Inductor "
              "cache, warm: a second process reading it. eager: the default dynamic cache, nothing compiled. "
              "The prompt's forward: a one-token generate, timed after the others (transformers compiles only the "
              "decoding steps); decode ms / token: the rest of a generate over its other tokens.", "",
              _timing.markdown_table(summarize(section["records"]), COLUMNS).rstrip()]
    return "\n".join(lines) + "\n"


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--smoke", action="store_true", help="CPU, tiny config, few tokens")
    p.add_argument("--family", action="append", choices=sorted(hf_models.BY_NAME))
    p.add_argument("--batch", type=int, action="append", help="batch sizes (default 1 and 32)")
    p.add_argument("--variant", default=",".join(VARIANTS))
    p.add_argument("--new-tokens", type=int, default=None)
    p.add_argument("--prompt", type=int, default=None)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--budget", type=float, default=None, help="seconds after which no new process starts")
    p.add_argument("--jobs", type=int, default=1, help="processes at once (their GPU work one at a time, under a "
                                                     "lock given back while Dynamo compiles)")
    p.add_argument("--profile", action="store_true", help="one more generate under torch.profiler per process: "
                   "GPU busy time against wall time, the host's top operators (in the record's 'profile')")
    p.add_argument("--results-dir", default=None)
    p.add_argument("--no-record", action="store_true")
    p.add_argument("--merge", nargs="+", metavar="JSON", help="merge the hf_generate.json files of several device "
                   "calls into the first (its .md rendered beside it): a section per commit")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.merge:
        return merge(args.merge)
    if args.worker:
        spec = json.loads(Path(args.worker).read_text())
        Path(spec["out"]).write_text(json.dumps(run_one(spec), default=str))
        return []
    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("hf_generate: no CUDA device; --smoke for the CPU path")
    spec = {"smoke": args.smoke, "device": device, "reps": args.reps, "profile": args.profile,
            "new_tokens": args.new_tokens or (4 if args.smoke else 128), "prompt": args.prompt or (8 if args.smoke else 32)}
    families = args.family or list(hf_models.STAGE)
    batches = args.batch or ([1, 2] if args.smoke else [1, 32])
    return _run(args, spec, families, batches, args.variant.split(","),
                Path(args.results_dir) if args.results_dir else hf_models.RESULTS)


def merge(paths: list[str]) -> list[dict]:
    """``paths[0]`` and the files after it (each call's copy) merged into ``paths[0]``, rendered in
    the ``.md`` beside it: the calls of one commit are one section."""
    target = Path(paths[0])
    sections = _hf_record.merge_files([Path(p) for p in paths if Path(p).exists()])
    _hf_record.save_sections(target, sections)
    for s in sections:
        if s.get("records"):
            _hf_record.write_markdown(target.with_suffix(".md"), TITLE, INTRO, s, section_markdown(s))
    print(f"merged {len(paths)} files: {len(sections)} sections in {target}")
    return [r for s in sections for r in s.get("records", [])]


def _run(args, spec, families, batches, variants, results) -> list[dict]:
    state = _hf_record.source_state()
    env = {**_timing.environment_info(), **_hf_record.env_versions()}
    call = {"id": _hf_record.call_id(), "started": env["date"], "argv": args.argv,
            "spec": {k: spec[k] for k in GPU_SPEC}}
    record_to = None if args.no_record or (args.smoke and not args.results_dir) else results
    sections = _hf_record.load_sections(record_to / "hf_generate.json") if record_to else []
    budget = hf_models.Budget(args.budget, 150.0)
    roots, records = tempfile.mkdtemp(prefix="hf_gen_caches_"), []
    jobs_n = max(1, getattr(args, "jobs", 1))
    lock_path = str(Path(roots) / "gpu.lock") if jobs_n > 1 else None
    quiet_path = str(Path(roots) / "quiet.lock") if jobs_n > 1 else None
    threads = _hf_sched.compile_threads(jobs_n)
    guard = __import__("threading").Lock()

    def run(job: _hf_sched.Job) -> dict:
        fam, batch, variant, cache = job.family, int(job.case.split()[-1]), job.variant, job.state
        folder = Path(roots) / fam / f"b{batch}" / variant
        env_vars = {"TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor"), "TRITON_CACHE_DIR": str(folder / "triton"),
                    **({"TORCHINDUCTOR_COMPILE_THREADS": threads} if threads else {})}
        r = _spawn({**spec, "family": fam, "batch": batch, "variant": variant, "gpu_lock": lock_path,
                   "quiet_lock": quiet_path}, env_vars,
                   budget.timeout())
        r.update(family=fam, case=job.case, variant=variant, cache="cold" if cache == "-" else cache,
                 source=state["source"], env=env, call=call["id"])
        return r

    def on_done(job: _hf_sched.Job, r: dict) -> list:
        with guard:
            records.append(r)
            _timing.progress({k: r.get(k) for k in ("family", "case", "variant", "cache", "tokens_per_s",
                                                    "first_s", "graphs", "recompiles", "rewrites", "error")})
            if record_to is not None:
                s = _hf_record.merge_into(sections, state, env, call, records)
                _hf_record.save_sections(record_to / "hf_generate.json", sections)
                _hf_record.write_markdown(record_to / "hf_generate.md", TITLE, INTRO, s, section_markdown(s))
        return []

    todo = []
    for i, (fam, batch) in enumerate((f, b) for f in families for b in batches):
        for vi, variant in enumerate(variants):
            states = ("-",) if variant == "eager" else ("cold", "warm")
            todo += [_hf_sched.Job(fam, f"batch {batch}", variant, r, st, (i, vi, r)) for r, st in enumerate(states)]
    try:
        _hf_sched.Scheduler(run, on_done, budget.spent, jobs_n)(todo)
    finally:  # the run's Inductor / Triton caches and its lock file: nothing left behind
        __import__("shutil").rmtree(roots, ignore_errors=True)
    _timing.print_table(summarize(records), COLUMNS, title="hf_generate")
    return records


if __name__ == "__main__":
    main()
