"""examples/hybrid_model.py served under torch.compile, on CPU (tiny config).

What must hold: every rewrite fires the expected number of times in every compiled
graph (``EXPECTED_MATCHES``, forced on CPU where the speed rules would leave the code to
Inductor); outputs match eager; serving T = 2, 7, 64, 300, 4096 tokens with automatic dynamic
shapes, ``mark_dynamic`` and ``dynamic=True`` costs no recompile after the first dynamic compile
(one more for the batch whose spec set is empty: Dynamo specializes size 0); fp16 models;
the default (unforced) options; all rewrites disabled = stock Inductor's code; a second process
hits the FX graph cache and still runs our kernels; tensor parallel over two gloo ranks.

Compiles here keep Inductor's kernel cache on and its FX graph cache off: our pass runs on every
graph (nothing is served from the FX cache), while identical C++ kernels are built once.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import kda_inductor
from kda_inductor import pass_manager
from kda_inductor import GraphReport, Report
from kda_inductor.testing import compile_for_test

ROOT = Path(__file__).resolve().parents[1]
import gdn_layers as G  # noqa: E402
import hybrid_model as H  # noqa: E402
from tests.helpers import stock_inductor_compiles_the_write  # noqa: E402

EXPECTED = H.EXPECTED_MATCHES
SIZES = (2, 7, 64, 300, 4096)


# --------------------------------------------------------------------------- helpers
@contextlib.contextmanager
def kernel_cache_only():
    """FX graph / AOT caches off (our pass runs on every graph), kernel caches on."""
    torch._dynamo.reset()
    patches = {"fx_graph_cache": False, "force_disable_caches": False}
    try:
        with torch._inductor.config.patch(patches), torch._functorch.config.patch(enable_autograd_cache=False):
            yield
    finally:
        torch._dynamo.reset()


def compile_model(model, **kw):
    kw.setdefault("caches", True)
    return compile_for_test(model, **kw)


def graph_failures(records, expect=EXPECTED) -> list[str]:
    """For every compiled graph whose matches differ from ``expect``: the counts and the
    closest misses (``Report.misses_text``), to name what broke."""
    out = []
    for i, rec in enumerate(records):
        got = {name: rec.matches.get(name, 0) for name in expect}
        if got != expect or rec.errors:
            rep = Report(pass_manager.total_matches([rec]), [GraphReport(rec)], [], [])
            out.append(f"graph {i}: matches {got} (expected {expect}); errors {rec.errors}\n"
                       + "\n".join(rep.misses_text()))
    return out


def assert_every_graph_rewritten(compiled, expect=EXPECTED):
    assert compiled.records, "no graph was compiled"
    failures = graph_failures(compiled.records, expect)
    assert not failures, "\n\n".join(failures)


def step(model, batch, fn):
    """Run a step compiled and eager on the same cache; compare outputs and cache."""
    msg = H.check_against_eager(model, batch, fn)
    assert "within" in msg


@pytest.fixture(scope="module")
def model():
    return H.make_model(H.HybridConfig.tiny(), core="torch")


# --------------------------------------------------------------------------- eager
@pytest.mark.parametrize("kind", ["spec", "prefill", "mixed"])
def test_eager_model_matches_token_by_token_reference(model, kind):
    """The split / merge / varlen paths of both recurrent layers against a token-by-token
    recomputation; the indexer cache is written at the new tokens' slots only."""
    torch.manual_seed(1)
    batch = {"spec": lambda: H.spec_decode_batch(model, 24, seed=1),
             "prefill": lambda: H.prefill_batch(model, 21, 3, seed=1),
             "mixed": lambda: H.make_batch(model, 2, 3, [5, 1, 4], seed=1)}[kind]()
    before = model.attn.kv_cache.clone()
    out, cache = H.run_step(model, batch)
    H.assert_step_close(out, H.reference_step(model, batch))
    blocks = (cache != before).view(cache.shape[0], -1).any(-1).nonzero().flatten()  # blocked layout
    written = batch.indexer.slot_mapping // model.cfg.indexer.block_size
    assert blocks.numel() and set(blocks.tolist()) <= set(written.tolist())
    if kind == "prefill":
        assert batch.spec.spec_idx.numel() == 0 and out[1].shape[0] == 0


def test_real_dims_by_default():
    c = H.HybridConfig()
    assert c.gdn.num_v_heads == 32 and c.gdn.conv_dim == 8192 and c.kda.num_heads == 32
    assert c.indexer.n_heads == 64 and c.indexer.head_dim == 128 and c.indexer.block_size == 64
    assert c.gdn.hidden_size == c.kda.hidden_size == c.indexer.dim == c.hidden_size


def test_layer_widths_must_agree():
    import dataclasses

    with pytest.raises(ValueError, match="wide"):
        H.HybridModel(dataclasses.replace(H.HybridConfig.tiny(), hidden_size=96))


# --------------------------------------------------------------------------- compiled, static
def test_spec_step_every_rewrite_fires_and_matches_eager(model):
    """One compiled spec-decode step: the expected matches per layer, outputs within one bf16
    step of eager, the cache's written slots within one fp8 step; our pass's own time."""
    torch.manual_seed(2)
    batch = H.spec_decode_batch(model, 24, seed=2)
    with kernel_cache_only(), pass_manager.timed() as spent:
        compiled = compile_model(model, dynamic=False)
        t0 = time.perf_counter()
        step(model, batch, compiled)
        total = time.perf_counter() - t0
    assert_every_graph_rewritten(compiled)
    assert len(compiled.records) == 1
    # the pass (observed: it also snapshots the graphs for explain) against the whole first call
    assert sum(spent) < 0.1 * total, (sum(spent), total)


def test_fp8_output_projections_spec_step():
    """With FP8 output projections (``make_model(fp8=True)``: vLLM's FP8 checkpoints) each
    recurrent layer's merge + gated norm + the projection's input quantization is one
    ``gated_norm_quant`` (forced), the rest as in the bf16 model; the step as close to eager."""
    fp8_model = H.make_model(H.HybridConfig.tiny(), core="torch", fp8=True)
    assert isinstance(fp8_model.gdn.out_proj, G.Fp8Linear) and isinstance(fp8_model.kda.out_proj, G.Fp8Linear)
    batch = H.spec_decode_batch(fp8_model, 24, seed=4)
    with kernel_cache_only():
        compiled = compile_model(fp8_model, dynamic=False)
        step(fp8_model, batch, compiled)
    expect = H.expected_matches(fp8=True)
    assert expect["gated_norm_quant"] == 2 and expect["gated_norm_merge"] == 0
    assert_every_graph_rewritten(compiled, expect)


@pytest.mark.parametrize("kind", ["prefill", "mixed"])
def test_prefill_steps_every_rewrite_fires_and_match_eager(model, kind):
    """A pure-prefill step (empty spec set) and a mixed one (spec + decode + prefill: a varlen
    non-spec set): the same rewrites, outputs as eager."""
    torch.manual_seed(3)
    batch = H.prefill_batch(model, 20, 4, seed=3) if kind == "prefill" else H.make_batch(model, 2, 2, [4, 3], seed=3)
    with kernel_cache_only():
        compiled = compile_model(model, dynamic=False)
        step(model, batch, compiled)
    assert_every_graph_rewritten(compiled, H.expected_matches(varlen=True))


# --------------------------------------------------------------------------- dynamic shapes
DYNAMIC_MODES = ["automatic", "mark_dynamic", "dynamic_true"]


@pytest.mark.parametrize("mode", DYNAMIC_MODES)
def test_dynamic_shapes_serve_every_size_without_recompiles(model, mode):
    """Warm up until the first dynamic compile, then serve T = 2, 7, 64, 300, 4096 (requests and
    spec tokens vary with T): no new compile, except at most one for T=2, whose spec set is
    empty (size 0 is specialized); every graph gets every rewrite; every step matches eager."""
    # a first dynamic compile at a T no model dim has: duck sizing gives equal sizes one symbol, so
    # T = 64 = hidden_size would specialize T to 64 (a guard of the norm weight's broadcast)
    warmup = (64, 300) if mode == "automatic" else (37,)

    def batch_for(T):
        torch.manual_seed(T)
        b = H.spec_decode_batch(model, T, seed=T)
        if mode == "mark_dynamic":  # the token, request and context dims
            for t, d in b.token_dim_tensors():
                torch._dynamo.mark_dynamic(t, d)
        return b

    with kernel_cache_only():
        compiled = compile_model(model, dynamic=True if mode == "dynamic_true" else None)
        for T in warmup:
            H.run_step(model, batch_for(T), compiled)
        first = len(compiled.records)
        assert first == len(warmup), f"{first} compiles to warm up {warmup}"
        new = {}
        for T in SIZES:
            before = len(compiled.records)
            b = batch_for(T)
            step(model, b, compiled)
            new[T] = len(compiled.records) - before
    assert_every_graph_rewritten(compiled)
    assert all(n == 0 for T, n in new.items() if T != 2) and new[2] <= 1, f"new compiles per T: {new}"


# --------------------------------------------------------------------------- precision, defaults
def test_float16_model(model):
    torch.manual_seed(4)
    m16 = H.make_model(H.HybridConfig.tiny(), dtype=torch.float16, core="torch")
    batch = H.spec_decode_batch(m16, 24, seed=4)
    assert batch.hidden.dtype == torch.float16
    with kernel_cache_only():
        compiled = compile_model(m16, dynamic=False)
        step(m16, batch, compiled)
    assert_every_graph_rewritten(compiled)


@contextlib.contextmanager
def stock_write_mode(model):
    """The cache write as stock Inductor can run it: eagerly where it cannot compile it (torch
    2.9), as ``benchmarks.report`` runs stock."""
    model.attn.eager_write = not stock_inductor_compiles_the_write()
    try:
        yield
    finally:
        model.attn.eager_write = False


def test_stock_inductor_is_as_far_from_eager(model):
    """The tolerance of ``check_against_eager`` is what stock Inductor itself needs: with every
    rewrite disabled the outputs need the same COMPILED_STEPS bf16 steps of eager."""
    torch.manual_seed(2)
    batch = H.spec_decode_batch(model, 24, seed=2)
    with kernel_cache_only():
        stock = torch.compile(model, backend="inductor", dynamic=False)
        with stock_write_mode(model):
            H.check_against_eager(model, batch, stock)


def test_default_options_compile_and_run_on_cpu(model):
    """What a CPU user gets (no force): compiles and matches eager, and is never slower than
    stock: at these sizes every rewrite's op loses to Inductor's C++ on CPU (measured, see each
    pattern file), so nothing is rewritten and the record says why, rewrite by rewrite. Where
    stock Inductor cannot compile the cache write (torch 2.9), the backend compiles the graph
    again with every rewrite, and the record's note says why."""
    stock_ok = stock_inductor_compiles_the_write()
    torch.manual_seed(5)
    batch = H.spec_decode_batch(model, 24, seed=5)
    with kernel_cache_only():
        compiled = compile_model(model, dynamic=False, force=False)
        step(model, batch, compiled)
    assert compiled.records and not any(r.errors for r in compiled.records)
    if not stock_ok:
        assert all("Inductor could not compile this graph" in r.note for r in compiled.records)
        assert_every_graph_rewritten(compiled)
        return
    assert not any(r.note for r in compiled.records)
    assert sum(compiled.matches.values()) == 0, compiled.matches
    for name in H.EXPECTED_MATCHES:
        why = [m.check for r in compiled.records for m in r.misses[name] if "left to Inductor" in m.check]
        assert why and all("cpu" in w for w in why), (name, why)


_NAMES = [
    (re.compile(r"/[^\s'\"]*torchinductor[^\s'\"]*"), "<path>"),  # cache paths of kernels
    (re.compile(r"\b[a-z0-9]{52}\b"), "<hash>"),  # cache keys in module names
    (re.compile(r"AOT ID: \['\d+_inference'\]"), "AOT ID: [N]"),  # graph counter
]


def normalized_code(code: str) -> str:
    """Output code without what legitimately differs between two compiles of one graph: cache
    paths (kernels live under per-compile dirs), cache-key hashes, the AOT graph counter."""
    for pattern, repl in _NAMES:
        code = pattern.sub(repl, code)
    return code


def test_all_rewrites_disabled_is_stock_inductor_code(model):
    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(6)
    batch = H.spec_decode_batch(model, 24, seed=6)
    codes = {}
    # A process's first Inductor compile of this model can lower it differently from later ones
    # (seen on torch 2.9 and 2.13: the indexer's gather kernel realizes one more uint8 buffer).
    # Compare two compiles that both follow a first one: the test passes run alone too.
    for label, backend, options in (("first", "inductor", None), ("stock", "inductor", None),
                                    ("disabled", "kda_inductor",
                                     {"kda": {"disable": list(kda_inductor.REWRITE_NAMES)}})):
        with kernel_cache_only(), stock_write_mode(model):
            fn = torch.compile(model, backend=backend, options=options, dynamic=False)
            _, code = run_and_get_code(lambda fn=fn: H.run_step(model, batch, fn))
        codes[label] = [normalized_code(c) for c in code]
    assert len(codes["stock"]) == len(codes["disabled"]) >= 1
    for a, b in zip(codes["stock"], codes["disabled"]):
        if a != b:
            import difflib

            diff = "\n".join(list(difflib.unified_diff(a.splitlines(), b.splitlines(), "stock", "disabled",
                                                       lineterm=""))[:60])
            pytest.fail(f"generated code differs:\n{diff}")


# --------------------------------------------------------------------------- FX graph cache
CACHE_SCRIPT = textwrap.dedent("""
    import json, os, sys
    os.environ.setdefault("TRITON_INTERPRET", "1")
    sys.path.insert(0, {examples!r})
    import torch
    from torch._dynamo.utils import counters
    import hybrid_model as H
    from kda_inductor import pass_manager
    options = json.loads(sys.argv[1])
    model = H.make_model(H.HybridConfig.tiny(), core="torch")
    torch.manual_seed(7)
    batch = H.spec_decode_batch(model, 24, seed=7)
    compiled = torch.compile(model, backend="kda_inductor", options={{"kda": options}}, dynamic=False)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof, \
            pass_manager.timed() as ran:
        msg = H.check_against_eager(model, batch, compiled)
    kda_ops = sorted({{e.name for e in prof.events() if e.name.startswith("kda::")}})
    print(json.dumps({{"hits": counters["inductor"]["fxgraph_cache_hit"],
                      "misses": counters["inductor"]["fxgraph_cache_miss"],
                      "pass_ran": len(ran), "kda_ops": kda_ops, "check": msg}}))
""")


def _run_cache_process(cache_dir: Path, options: dict, extra_path: Path | None = None) -> dict:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache_dir), OMP_NUM_THREADS="1",
               TORCHINDUCTOR_FX_GRAPH_CACHE="1", TORCHINDUCTOR_AUTOGRAD_CACHE="1")
    if extra_path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(extra_path), env.get("PYTHONPATH", "")])
    script = CACHE_SCRIPT.format(examples=str(ROOT / "examples"))
    # "python -c" puts the working directory first on sys.path: run from the copy when there is one
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(options)], capture_output=True, text=True,
                          env=env, timeout=900, cwd=extra_path or ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_second_process_hits_fx_graph_cache_and_runs_our_kernels(tmp_path):
    """Caches on in a temporary dir: process 1 compiles (miss), process 2 is served from the FX
    graph cache (our pass does not run) and still calls kda:: ops; a changed source file of ours
    (a copy of the package with one comment added) misses. (A changed kda option misses too:
    ``test_backend.test_fx_graph_cache_serves_same_options_and_never_stale``, in process.)"""
    import shutil

    cache = tmp_path / "inductor"
    first = _run_cache_process(cache, {"force": True})
    assert first["misses"] >= 1 and first["hits"] == 0 and first["pass_ran"] >= 1, first
    second = _run_cache_process(cache, {"force": True})
    assert second["hits"] >= 1 and second["misses"] == 0 and second["pass_ran"] == 0, second
    assert set(second["kda_ops"]) >= {f"kda::{n}" for n in ("indexer_k_write", "indexer_k_gather",
                                                               "gdn_spec_split", "gated_norm_merge")}, second
    pkg = tmp_path / "src"
    shutil.copytree(ROOT / "kda_inductor", pkg / "kda_inductor", ignore=shutil.ignore_patterns("__pycache__"))
    with open(pkg / "kda_inductor" / "patterns" / "gdn_spec_split.py", "a") as f:
        f.write("\n# a change to our code\n")
    changed = _run_cache_process(cache, {"force": True}, extra_path=pkg)
    assert changed["misses"] >= 1 and changed["pass_ran"] >= 1, changed


# --------------------------------------------------------------------------- tensor parallel
TP_SCRIPT = textwrap.dedent("""
    import json, os, sys
    os.environ.setdefault("TRITON_INTERPRET", "1")
    sys.path.insert(0, {examples!r})
    import torch, torch.distributed as dist
    import hybrid_model as H
    from kda_inductor.testing import compile_for_test
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    full = H.make_model(H.HybridConfig.tiny(), core="torch")
    torch.manual_seed(8)
    batch = H.spec_decode_batch(full, 24, seed=8)
    want, want_cache = H.run_step(full, batch)
    tp = H.shard_model(full, rank, world, dist.group.WORLD)
    gdn = H.shard_states("gdn", full.cfg.gdn, batch.gdn_states, rank, world)
    kda = H.shard_states("kda", full.cfg.kda, batch.kda_states, rank, world)
    args = list(batch.args())
    args[3:7], args[7:11] = gdn, kda
    with torch._inductor.config.patch(fx_graph_cache=False):
        compiled = compile_for_test(tp, caches=True, dynamic=False)
        with torch.no_grad():
            got = compiled(*args, **batch.kwargs())
    want_states = [*H.shard_states("gdn", full.cfg.gdn, want[1:5], rank, world),
                   *H.shard_states("kda", full.cfg.kda, want[5:9], rank, world)]
    H.assert_step_close([got[0], *got[1:]], [want[0], *want_states], H.COMPILED_STEPS)
    why = H.cache_mismatch(tp.attn.kv_cache, want_cache, batch.indexer.slot_mapping, 128)
    print(json.dumps({{"rank": rank, "matches": [r.matches for r in compiled.records],
                      "errors": [r.errors for r in compiled.records], "cache": why}}))
    dist.destroy_process_group()
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_tensor_parallel_two_ranks_each_graph_rewritten_and_output_matches():
    """Heads (and MLP columns) split over 2 gloo ranks with the model's own all-reduces:
    every rank's graph gets every rewrite, and the all-reduced output and each rank's states
    match the unsplit eager model."""
    port = _free_port()
    script = TP_SCRIPT.format(examples=str(ROOT / "examples"))
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT))
    results = []
    for p in procs:
        out, err = p.communicate(timeout=900)
        assert p.returncode == 0, err[-4000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    for r in results:
        assert r["matches"] and all({k: m[k] for k in EXPECTED} == EXPECTED for m in r["matches"]), r
        assert not any(r["errors"]) and r["cache"] is None, r
