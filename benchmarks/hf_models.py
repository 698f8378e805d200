"""transformers' own hybrid models under eager, stock ``torch.compile`` and ``kda_inductor``:
``python -m benchmarks.hf_models`` (GPU), ``python -m benchmarks.hf_models --smoke`` (CPU checks).

Every transformers family with a GDN, KDA or DeepSeek-V3.2-style indexer layer (issue 21), built
from its config class with random weights (no download): the released model's per-layer dims
(hard-coded below from the config class defaults of transformers 5.24, which its docstring
attributes to the named checkpoint), 4 layers (3 linear-attention + 1 full-attention; indexer
families: 4 indexed-attention layers, the first with a dense MLP), 16 MoE experts, bf16, a 4096
token vocabulary (the timed module is the decoder stack, ``model.model``: no LM head). A family
missing from the installed transformers is skipped with a message.

Cases: decode (32 and 128 sequences, one new token each, a cache of 256 tokens built by an eager
prefill through the model's own cache class; each timed step starts from that cache: its tensors
are put back on the host before each call, so shapes never change) and prefill (1 x 4096 tokens,
``use_cache=True``). Variants: eager, stock ``torch.compile``, ``backend="kda_inductor"``
(compiled through ``kda_inductor.explain()``, whose rewrite table and misses are recorded), all
under ``torch.inference_mode()``. GPU timing: CUDA-graph replay (``_timing.graph_replay_median_us``)
where capture works, else CUDA events around plain calls (``_timing.eager_median_us``); the
method is in each row. Compile time is the first call's wall time.

On GPU the recurrent cores are what transformers picks (fla-core when installed, causal-conv1d
when installed); ``--smoke`` runs the tiny configs on CPU with transformers' torch reference
cores and the rewrites forced, checks every variant against eager, and records nothing.
Writes ``benchmarks/results/hf_models.{md,json}`` on GPU runs unless ``--no-record``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import importlib
import statistics
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

_HERE = Path(__file__).resolve().parent
if str(_HERE.parent) not in sys.path:
    sys.path.insert(0, str(_HERE.parent))

from benchmarks import _timing  # noqa: E402

RESULTS = _HERE / "results"
LINEAR, FULL = "linear_attention", "full_attention"


@dataclasses.dataclass(frozen=True)
class Family:
    """One transformers model family: where its classes live and the released model's dims."""

    name: str
    module: str               # transformers.models.<module>
    config: str               # config class
    model: str                # causal-LM class
    checkpoint: str           # the released model the dims come from
    dims: dict[str, Any]      # per-layer dims of that model
    kind: str = "linear"      # "linear" (GDN / KDA + full attention) or "indexer" (all indexed)
    full_type: str = FULL     # the layer type of the one non-linear layer


# Per-layer dims of the released models: the config classes' defaults in transformers 5.24
# (each class's docstring names the checkpoint). Layer counts, vocab and expert counts are set
# by ``config_for``.
FAMILIES = [
    Family("qwen3_next", "qwen3_next", "Qwen3NextConfig", "Qwen3NextForCausalLM",
           "Qwen/Qwen3-Next-80B-A3B-Instruct",
           {"hidden_size": 2048, "intermediate_size": 5632, "num_attention_heads": 16, "num_key_value_heads": 2,
            "head_dim": 256, "rms_norm_eps": 1e-06, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
            "linear_value_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
            "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "num_experts_per_tok": 10}),
    Family("qwen3_5", "qwen3_5", "Qwen3_5TextConfig", "Qwen3_5ForCausalLM", "Qwen/Qwen3.5-27B",
           {"hidden_size": 4096, "intermediate_size": 12288, "num_attention_heads": 16, "num_key_value_heads": 4,
            "head_dim": 256, "rms_norm_eps": 1e-06, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
            "linear_value_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32}),
    Family("qwen3_5_moe", "qwen3_5_moe", "Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM", "Qwen/Qwen3.5-35B-A3B",
           {"hidden_size": 2048, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
            "rms_norm_eps": 1e-06, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
            "linear_value_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
            "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "num_experts_per_tok": 8}),
    Family("kimi_linear", "kimi_linear", "KimiLinearConfig", "KimiLinearForCausalLM",
           "moonshotai/Kimi-Linear-48B-A3B-Instruct",
           {"hidden_size": 2304, "intermediate_size": 9216, "moe_intermediate_size": 1024, "num_attention_heads": 32,
            "num_key_value_heads": 32, "num_shared_experts": 1, "routed_scaling_factor": 2.446, "kv_lora_rank": 512,
            "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128, "num_expert_group": 1,
            "topk_group": 1, "num_experts_per_token": 8, "rms_norm_eps": 1e-05, "linear_head_dim": 128,
            "linear_num_heads": 32, "linear_conv_kernel_dim": 4}),
    Family("deepseek_v32", "deepseek_v32", "DeepseekV32Config", "DeepseekV32ForCausalLM",
           "deepseek-ai/DeepSeek-V3.2-Exp",
           {"hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_attention_heads": 128,
            "num_key_value_heads": 128, "n_shared_experts": 1, "routed_scaling_factor": 2.5, "kv_lora_rank": 512,
            "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128, "n_group": 8,
            "topk_group": 4, "num_experts_per_tok": 8, "rms_norm_eps": 1e-06, "index_topk": 2048,
            "index_head_dim": 128, "index_n_heads": 64}, kind="indexer"),
    Family("olmo_hybrid", "olmo_hybrid", "OlmoHybridConfig", "OlmoHybridForCausalLM", "allenai/Olmo-Hybrid-7B",
           {"hidden_size": 3840, "intermediate_size": 11008, "num_attention_heads": 30, "num_key_value_heads": 30,
            "rms_norm_eps": 1e-06, "linear_num_key_heads": 30, "linear_num_value_heads": 30,
            "linear_key_head_dim": 96, "linear_value_head_dim": 192, "linear_conv_kernel_dim": 4}),
    Family("bailing_hybrid", "bailing_hybrid", "BailingHybridConfig", "BailingHybridForCausalLM",
           "inclusionAI/Ling-3.0-Flash",
           {"hidden_size": 2560, "intermediate_size": 6144, "moe_intermediate_size": 768, "num_attention_heads": 32,
            "num_key_value_heads": 32, "num_shared_experts": 1, "routed_scaling_factor": 2.5, "kv_lora_rank": 512,
            "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128, "num_expert_group": 8,
            "topk_group": 4, "num_experts_per_token": 8, "rms_norm_eps": 1e-06, "linear_head_dim": 128,
            "linear_num_heads": 32, "linear_conv_kernel_dim": 4}),
    Family("lara_mini", "lara_mini", "LaraMiniConfig", "LaraMiniForCausalLM", "translated/Lara-4-Mini-Base",
           {"hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 128,
            "rms_norm_eps": 1e-06, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
            "linear_value_head_dim": 128, "linear_num_key_heads": 8, "linear_num_value_heads": 16,
            "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "num_experts_per_tok": 4}),
    Family("glm_moe_dsa", "glm_moe_dsa", "GlmMoeDsaConfig", "GlmMoeDsaForCausalLM", "zai-org/GLM-5",
           {"hidden_size": 6144, "intermediate_size": 12288, "moe_intermediate_size": 2048, "num_attention_heads": 64,
            "num_key_value_heads": 64, "n_shared_experts": 1, "routed_scaling_factor": 2.5, "kv_lora_rank": 512,
            "q_lora_rank": 2048, "qk_rope_head_dim": 64, "v_head_dim": 256, "qk_nope_head_dim": 192, "n_group": 1,
            "topk_group": 1, "num_experts_per_tok": 8, "rms_norm_eps": 1e-05, "index_topk": 2048,
            "index_head_dim": 128, "index_n_heads": 32}, kind="indexer"),
]
BY_NAME = {f.name: f for f in FAMILIES}
STAGE = ("qwen3_next", "qwen3_5", "kimi_linear", "deepseek_v32")
"""The families of ``.ci/gpu hf`` (``--stage``): GDN, GDN + dense MLP, KDA and the DeepSeek-V3.2
indexer, one each; the others are run by name (``--family``)."""

# tiny dims for CPU tests: applied to the keys a family's config has
TINY = {
    "hidden_size": 64, "intermediate_size": 64, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "linear_key_head_dim": 16,
    "linear_value_head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_head_dim": 16,
    "linear_num_heads": 4, "num_experts_per_tok": 2, "num_experts_per_token": 2, "kv_lora_rank": 16,
    "q_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16, "index_head_dim": 16,
    "index_n_heads": 2, "index_topk": 8, "n_group": 1, "topk_group": 1, "num_expert_group": 1,
}
N_LAYERS, N_EXPERTS, VOCAB, TINY_EXPERTS, TINY_VOCAB = 4, 16, 4096, 4, 128


def load(family: Family):
    """``(config class, model class, modeling module)``, or None (with a message) where the
    installed transformers lacks the family."""
    try:
        import transformers

        modeling = importlib.import_module(f"transformers.models.{family.module}.modeling_{family.module}")
        return getattr(transformers, family.config), getattr(transformers, family.model), modeling
    except (ImportError, AttributeError) as err:
        print(f"{family.name}: skipped, not in this transformers ({type(err).__name__}: {err})", flush=True)
        return None


def config_for(family: Family, config_cls, *, tiny: bool):
    """The family's config: real or tiny dims, 4 layers, few experts, small vocab, eager attention."""
    defaults = config_cls().to_dict()
    kw = dict(family.dims)
    if tiny:
        kw.update({k: v for k, v in TINY.items() if k in defaults and (k != "q_lora_rank" or defaults[k])})
        if "kv_lora_rank" in defaults:  # MLA: one KV head per query head
            kw["num_key_value_heads"] = kw["num_attention_heads"]
    kw["num_hidden_layers"] = N_LAYERS
    kw["vocab_size"] = TINY_VOCAB if tiny else VOCAB
    for key in ("num_experts", "n_routed_experts"):
        if key in defaults:
            kw[key] = TINY_EXPERTS if tiny else N_EXPERTS
    if family.kind == "linear":
        kw["layer_types"] = [LINEAR] * (N_LAYERS - 1) + [family.full_type]
    else:
        kw["layer_types"] = [defaults["layer_types"][0]] * N_LAYERS
    if "mlp_layer_types" in defaults:
        kw["mlp_layer_types"] = ["dense"] + ["sparse"] * (N_LAYERS - 1)
    if "first_k_dense_replace" in defaults:
        kw["first_k_dense_replace"] = 1
    if "indexer_types" in defaults:
        kw["indexer_types"] = [defaults["indexer_types"][0]] * N_LAYERS
    if "mlp_only_layers" in defaults:
        kw["mlp_only_layers"] = []
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if key in defaults:
            kw[key] = None
    config = config_cls(**kw)
    config._attn_implementation = "sdpa"
    return config


def linear_layers(family: Family) -> int:
    """How many linear-attention (GDN / KDA) layers the built model has."""
    return N_LAYERS - 1 if family.kind == "linear" else 0


def use_torch_cores(modeling) -> None:
    """Point the modeling module at transformers' own torch reference cores (the functions that
    ``use_kernel_func_from_hub_with_fallback`` wraps, reachable as ``__wrapped__``): on CPU the
    fla / causal-conv1d Triton kernels transformers picks when installed cannot run."""
    for name, fn in list(vars(modeling).items()):
        code = getattr(fn, "__code__", None)
        if callable(getattr(fn, "__wrapped__", None)) and code is not None and "hub_kernels" in code.co_filename:
            setattr(modeling, name, fn.__wrapped__)


def build(family: Family, *, tiny: bool, device: str, dtype=torch.bfloat16, seed: int = 0):
    """``(model, config)`` of the family with random weights, in eval mode; None if missing."""
    loaded = load(family)
    if loaded is None:
        return None
    config_cls, model_cls, modeling = loaded
    if device == "cpu":
        use_torch_cores(modeling)
    torch.manual_seed(seed)
    config = config_for(family, config_cls, tiny=tiny)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = model_cls(config).to(device=device, dtype=dtype).eval()
    return model, config


# --------------------------------------------------------------------------- the steps


def _cache_tensors(cache) -> list[tuple[Any, dict[str, Any], dict[str, Any]]]:
    """Every layer object of ``cache`` (and the cache) with its attributes (containers copied:
    transformers keeps linear-attention states in dicts) and clones of its tensors."""
    from torch.utils._pytree import tree_map

    out = []
    for holder in [*(getattr(cache, "layers", None) or []), cache]:
        state = {k: copy.copy(v) for k, v in vars(holder).items() if k != "layers"}
        clones = {k: tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, v) for k, v in state.items()}
        out.append((holder, state, clones))
    return out


def _restore(snapshot, *, values: bool = False) -> None:
    """Put the cache's attributes back (host only); with ``values``, also its tensors' contents."""
    from torch.utils._pytree import tree_leaves

    for holder, state, clones in snapshot:
        for k, v in state.items():
            setattr(holder, k, copy.copy(v))
            if values:
                for t, c in zip(tree_leaves(v), tree_leaves(clones[k])):
                    if isinstance(t, torch.Tensor):
                        t.copy_(c)


def decode_case(model, config, *, batch: int, context: int, device: str):
    """``(step, reset)``: one decode step of ``batch`` sequences on a cache of ``context`` tokens
    that an eager prefill built. Each step first puts the cache's tensors back as the prefill
    left them, on the host only (the full-attention KV it grew, the states it replaced), so
    shapes never change; states updated in place keep their new values (timing). ``reset()``
    also restores their contents (checks)."""
    gen = torch.Generator(device="cpu").manual_seed(1)
    prompt = torch.randint(0, config.vocab_size, (batch, context), generator=gen).to(device)
    token = torch.randint(0, config.vocab_size, (batch, 1), generator=gen).to(device)
    with torch.inference_mode():
        cache = model.model(input_ids=prompt, use_cache=True).past_key_values
    snapshot = _cache_tensors(cache)
    position = torch.full((batch, 1), context, device=device, dtype=torch.long)

    def inputs():
        _restore(snapshot)
        return {"input_ids": token, "past_key_values": cache, "use_cache": True, "position_ids": position}

    def step(decoder):
        return decoder(**inputs()).last_hidden_state

    step.inputs = inputs
    return step, lambda: _restore(snapshot, values=True)


def prefill_case(model, config, *, tokens: int, device: str):
    gen = torch.Generator(device="cpu").manual_seed(2)
    prompt = torch.randint(0, config.vocab_size, (1, tokens), generator=gen).to(device)

    def inputs():
        return {"input_ids": prompt, "use_cache": True}

    def step(decoder):
        return decoder(**inputs()).last_hidden_state

    step.inputs = inputs
    return step, lambda: None


# --------------------------------------------------------------------------- running


def report_summary(report) -> dict[str, Any]:
    """explain()'s rewrite table, its shown misses as text lines, the rewrites that failed (and
    why), the graph breaks and the frames that fell back to eager, each with its reason."""
    misses = [line.strip() for line in report.misses_text() if line.strip()]
    errors = {name: err for g in report.graphs for name, err in g.errors.items()}
    return {"matches": dict(report.matches), "misses": misses, "errors": errors,
            "graph_breaks": [f"{b.count}x {b.reason}" for b in report.graph_breaks],
            "eager_frames": [f"{f.name} ({f.location}): {f.reason}" for f in report.eager_frames]}


def kda_compile(decoder, call: Callable, options: dict | None):
    """``decoder`` compiled with kda_inductor through ``kda_inductor.Explainer`` (which calls it
    once on ``call``'s inputs): ``(zero-argument compiled step, report)``. The cache's host-side
    reset stays outside the compiled code."""
    import kda_inductor

    report = kda_inductor.Explainer(options=options)(decoder, **call.inputs())
    return (lambda: call(report.compiled)), report


def time_us(fn: Callable, device: str) -> tuple[float | None, str]:
    """GPU time of ``fn()``: CUDA-graph replay, else CUDA events; CPU: wall clock (not meaningful)."""
    if device != "cuda":
        return _timing.perf_counter_median_us(fn, reps=1), "cpu-wall"
    try:
        return _timing.graph_replay_median_us(fn, warmup=3, reps=20, inner=5), "graph"
    except Exception as err:  # capture failed (host sync, dynamic allocation): time plain calls
        torch.cuda.synchronize()
        print(f"    CUDA graph capture failed ({type(err).__name__}: {str(err)[:120]}); timing with events",
              flush=True)
        return _timing.eager_median_us(fn, reps=10, warmup=2), "events"


STOCK_FIX = "stock+fix"
"""Stock Inductor with kda_inductor's ``is_exporting()`` fix applied to its traces
(``_dynamo_fixes.applied_to_every_backend``): what the fix gives, apart from the rewrites. Run only
where this torch folds the constant (torch <= 2.12); on a torch that has the fix it is stock."""


def variants_for(requested: list[str] | None, fired: dict[str, int] | None) -> list[str]:
    """The compiled variants of a case, in order: stock, stock+fix (where this torch needs the
    fix), kda, then kda-no-<rewrite> for every rewrite that fired in kda (``fired``: kda's
    matches; None before kda ran). ``requested`` narrows them (``--variant``)."""
    from kda_inductor import _dynamo_fixes

    out = ["stock"] + ([STOCK_FIX] if _dynamo_fixes.torch_folds_is_exporting() else []) + ["kda"]
    out += [f"kda-no-{name}" for name, n in (fired or {}).items() if n]
    return [v for v in out if requested is None or v in requested or
            (v.startswith("kda-no-") and "kda-no-*" in requested)]


def compile_variant(variant: str, decoder, call: Callable, options: dict | None):
    """``(zero-argument step, explain() report or None)`` of one compiled variant, called once
    (the compile)."""
    from kda_inductor import _dynamo_fixes

    if variant in ("stock", STOCK_FIX):
        compiled = torch.compile(decoder, backend="inductor")
        step = lambda: call(compiled)  # noqa: E731
        with _dynamo_fixes.applied_to_every_backend() if variant == STOCK_FIX else contextlib.nullcontext():
            step()
        return step, None
    disabled = [variant.removeprefix("kda-no-")] if variant.startswith("kda-no-") else []
    opts = dict(options or {})
    if disabled:
        opts["kda"] = {**opts.get("kda", {}), "disable": disabled}
    return kda_compile(decoder, call, opts or None)


def run_case(label: str, model, call: Callable, reset: Callable, *, device: str, kda_options: dict | None,
             check: bool, requested: list[str] | None = None, rounds: int = 3) -> dict[str, Any]:
    """Eager and every compiled variant (``variants_for``) of one case: compile times, explain()
    summary of kda; with ``check``, each output compared against eager's. On a GPU each variant's
    step is captured in a CUDA graph right after its compile and the graphs are replayed in turn,
    ``rounds`` rounds (``_timing.alternating_replay_us``: shared clock drift); the row keeps each
    variant's median and its spread over the rounds (the noise)."""
    decoder = model.model
    row: dict[str, Any] = {"case": label, "date": _timing.environment_info().get("date")}
    graphs: dict[str, Any] = {}
    with torch.inference_mode():
        reset()
        expected = call(decoder).clone()
        _capture(row, graphs, "eager", lambda: call(decoder), device)
        fired, first = None, variants_for(requested, None)
        for variant in first:
            fired = _run_variant(row, graphs, variant, decoder, call, reset, expected, device=device,
                                 options=kda_options, check=check) or fired
        for variant in [v for v in variants_for(requested, fired) if v not in first]:
            _run_variant(row, graphs, variant, decoder, call, reset, expected, device=device,
                         options=kda_options, check=check)
        if graphs:
            for variant, samples in _timing.alternating_replay_us(
                    {v: g for v, (g, _) in graphs.items()}, rounds=rounds, reps=10, inner=5).items():
                row[f"{variant}_us"] = statistics.median(samples)
                row[f"{variant}_spread"] = (max(samples) - min(samples)) / statistics.median(samples)
    torch._dynamo.reset()
    _timing.add_ratios(row, [("stock_vs_eager", "stock_us", "eager_us"), ("kda_vs_stock", "kda_us", "stock_us"),
                             ("kda_vs_eager", "kda_us", "eager_us"), ("kda_vs_stock_fix", "kda_us", f"{STOCK_FIX}_us"),
                             *[(f"{v}_vs_kda", f"{v}_us", "kda_us") for v in variants_for(requested, fired)
                               if v.startswith("kda-no-")]])
    return row


def _capture(row: dict, graphs: dict, variant: str, step: Callable, device: str) -> None:
    """Capture ``step`` in a CUDA graph for the alternating replays (``graphs``), or time it now
    (CPU: wall clock; a step that cannot be captured: CUDA events) into ``row``."""
    if device == "cuda":
        try:
            graphs[variant] = _timing.capture_graph(step, warmup=3)
            row[f"{variant}_timing"] = "graph"
            return
        except Exception as err:  # capture failed (host sync, dynamic allocation): time plain calls
            torch.cuda.synchronize()
            print(f"    {variant}: CUDA graph capture failed ({type(err).__name__}: {str(err)[:120]}); "
                  "timing with events", flush=True)
    if device == "cuda":
        row[f"{variant}_us"], row[f"{variant}_timing"] = _timing.eager_median_us(step, reps=10, warmup=2), "events"
    else:
        row[f"{variant}_us"], row[f"{variant}_timing"] = time_us(step, device)


def _run_variant(row: dict, graphs: dict, variant: str, decoder, call, reset, expected, *, device: str,
                 options: dict | None, check: bool) -> dict[str, int] | None:
    """Compile, check and capture one variant; kda's rewrite counts (None for other variants)."""
    from kda_inductor.testing import assert_close_to_eager

    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    reset()
    t0 = time.perf_counter()
    try:
        step, report = compile_variant(variant, decoder, call, options)
        row[f"{variant}_compile_s"] = time.perf_counter() - t0
        row[f"{variant}_graphs"] = counters["stats"].get("unique_graphs")
        row[f"{variant}_breaks"] = sum(counters["graph_break"].values())
        if report is not None and variant == "kda":
            row.update(report_summary(report))
        reset()
        out = step()
        if check:
            assert_close_to_eager(out, expected, rtol=0.05, atol=0.05)
        _capture(row, graphs, variant, step, device)
        return dict(report.matches) if report is not None and variant == "kda" else None
    except Exception as err:
        if check:
            raise
        row[f"{variant}_error"] = f"{type(err).__name__}: {str(err)[:300]}"
        traceback.print_exc()
        return None


def run_family(family: Family, *, smoke: bool, device: str, decode_batches, context: int, prefill: int | None,
               requested: list[str] | None = None, rounds: int = 3):
    # --smoke checks against eager: indexer families (nothing rewritten) in float32, whose bf16
    # top-k selection flips between eager and Inductor on rounding ties
    dtype = torch.float32 if smoke and family.kind == "indexer" else torch.bfloat16
    built = build(family, tiny=smoke, device=device, dtype=dtype)
    if built is None:
        return []
    model, config = built
    options = {"kda": {"force": True}} if smoke else None
    cases = [(f"decode {b} x 1 (cache {context})", decode_case(model, config, batch=b, context=context, device=device))
             for b in decode_batches]
    if prefill is not None:
        cases.append((f"prefill 1 x {prefill}", prefill_case(model, config, tokens=prefill, device=device)))
    rows = []
    for label, (step, reset) in cases:
        row = run_case(label, model, step, reset, device=device, kda_options=options, check=smoke,
                       requested=requested, rounds=rounds)
        rows.append({"family": family.name, "checkpoint": family.checkpoint, **row})
        _timing.progress(rows[-1])
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return rows


COLUMNS = [("family", "family", ""), ("case", "case", ""), ("date", "date", ""), ("eager_us", "eager us", ".0f"),
           ("stock_us", "stock us", ".0f"), (f"{STOCK_FIX}_us", "stock+fix us", ".0f"), ("kda_us", "kda us", ".0f"),
           ("kda_vs_stock", "kda/stock", ".3f"), ("kda_vs_stock_fix", "kda/(stock+fix)", ".3f"),
           ("without", "kda-no-<rewrite> / kda", ""), ("noise", "spread", ""), ("graphs", "graphs (breaks)", ""),
           ("stock_compile_s", "stock compile s", ".0f"),
           ("kda_compile_s", "kda compile s", ".0f"), ("matches", "rewrites", ""), ("kda_timing", "timing", "")]


def _fmt_matches(row: dict) -> dict:
    """A row as the table shows it: the rewrites that fired, each kda-no-<rewrite> variant's time
    over kda's, and the largest spread of a variant's replay rounds."""
    out = dict(row)
    m = row.get("matches")
    if isinstance(m, dict):
        out["matches"] = ", ".join(f"{k} {v}" for k, v in m.items() if v) or "-"
    out["without"] = ", ".join(f"{k[7:-7]} {v:.3f}" for k, v in row.items()
                               if k.startswith("kda-no-") and k.endswith("_vs_kda") and v is not None) or "-"
    out["graphs"] = " / ".join(f"{v} {row.get(f'{v}_graphs')} ({row.get(f'{v}_breaks')})"
                               for v in ("stock", STOCK_FIX, "kda") if row.get(f"{v}_graphs") is not None) or "-"
    spreads = [v for k, v in row.items() if k.endswith("_spread") and v is not None]
    out["noise"] = f"{max(spreads):.1%}" if spreads else "-"
    return out


def merged_rows(rows: list[dict]) -> list[dict]:
    """This run's rows plus the recorded ones of other (family, case) pairs (runs split by
    ``--family`` / ``--case`` build one table); family order as in FAMILIES."""
    import json

    path = RESULTS / "hf_models.json"
    recorded = json.loads(path.read_text()) if path.exists() else {}
    old = [{"date": recorded.get("env", {}).get("date"), **r} for r in recorded.get("rows", [])]
    new_keys = {(r.get("family"), r.get("case")) for r in rows}
    kept = [r for r in old if (r.get("family"), r.get("case")) not in new_keys]
    order = {f.name: i for i, f in enumerate(FAMILIES)}
    return sorted(kept + rows, key=lambda r: (order.get(r.get("family"), 99), str(r.get("case"))))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny configs on CPU, rewrites forced; checks only")
    parser.add_argument("--family", action="append", choices=sorted(BY_NAME), help="only these (repeatable)")
    parser.add_argument("--case", action="append", choices=["decode32", "decode128", "prefill"],
                        help="only these cases (repeatable; default all)")
    parser.add_argument("--stage", action="store_true", help=f"the families of `.ci/gpu hf`: {', '.join(STAGE)}")
    parser.add_argument("--variant", default=None,
                        help="comma list of compiled variants to run (stock, stock+fix, kda, kda-no-<rewrite>, "
                             "kda-no-* for every rewrite that fired); default all")
    parser.add_argument("--rounds", type=int, default=3, help="alternating replay rounds (the spread is the noise)")
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    device = "cpu" if args.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("hf_models: no CUDA device; use --smoke for the CPU checks")
    try:
        import transformers
    except ImportError:
        raise SystemExit("hf_models needs transformers: pip install transformers (and fla-core on a GPU)")
    names = [*(args.family or []), *(STAGE if args.stage else [])]
    families = [BY_NAME[n] for n in dict.fromkeys(names)] if names else FAMILIES
    cases = args.case or ["decode32", "decode128", "prefill"]
    shapes = dict(decode_batches=(2,), context=8, prefill=16) if args.smoke else \
        dict(decode_batches=tuple(b for b in (32, 128) if f"decode{b}" in cases), context=256,
             prefill=4096 if "prefill" in cases else None)
    requested = args.variant.split(",") if args.variant else None
    rows = []
    for family in families:
        try:
            rows += run_family(family, smoke=args.smoke, device=device, requested=requested, rounds=args.rounds,
                               **shapes)
        except Exception as err:
            if args.smoke:
                raise
            traceback.print_exc()
            rows.append({"family": family.name, "case": "build", "error": f"{type(err).__name__}: {err}"[:300]})
    try:
        import fla  # noqa: F401

        fla_version = getattr(fla, "__version__", "installed")
    except ImportError:
        fla_version = None
    notes = (f"transformers {transformers.__version__}, fla-core {fla_version}; 4 layers (3 linear + 1 full, "
             f"indexer families 4 indexed), {N_EXPERTS} experts, bf16, random weights, decoder stack only; "
             "rewrites by default speed rules; CUDA-graph replays of every variant in turn "
             "(the median of the rounds; spread: the largest (max - min) / median of a variant's rounds); "
             "kda-no-<rewrite>: kda with that rewrite disabled; stock+fix: stock with the is_exporting fix "
             "(only where this torch folds it)")
    _timing.finish("hf_models", [_fmt_matches(r) for r in rows], COLUMNS, notes, smoke=args.smoke,
                   record=False, results_dir=RESULTS, started=started)
    if not args.smoke and not args.no_record:
        rows = merged_rows(rows)
        payload = {"benchmark": "hf_models", "env": _timing.environment_info(), "notes": notes, "rows": rows}
        _timing.record_results("hf_models", payload, _timing.markdown_table([_fmt_matches(r) for r in rows], COLUMNS),
                               results_dir=RESULTS, title="transformers hybrid models", notes=notes)


if __name__ == "__main__":
    main()
