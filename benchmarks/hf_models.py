"""transformers' own hybrid models under eager, stock ``torch.compile`` and ``kda_inductor``, as a
user gets them: ``python -m benchmarks.hf_models`` (GPU), ``--smoke`` (CPU, tiny configs).

Every transformers family with a GDN, KDA or DeepSeek-V3.2-style indexer layer, built
from its config class with random weights (no download): the released model's per-layer dims
(hard-coded below from the config class defaults of transformers 5.24, which its docstring
attributes to the named checkpoint), 4 layers (3 linear-attention + 1 full-attention; indexer
families: 4 indexed-attention layers, the first with a dense MLP), 16 MoE experts, bf16, a 4096
token vocabulary. The timed module is the decoder stack, ``model.model``; the LM head is added
only for the logits check. A family missing from the installed transformers is skipped.

Cases (``--case``): decode32 / decode128 (32 / 128 sequences, one new token each, on a cache of
256 tokens an eager prefill built; each timed step starts from that cache: its tensors are put
back on the host before each call, so shapes never change) and prefill (1 x 4096 tokens).
Variants (``--variant``): eager, stock, stock+fix (where this torch folds ``is_exporting()``),
kda, and kda-no-<rewrite> for every registered rewrite that fired in kda's first compile; any of
them with ``@no-fla`` (``kda@no-fla``): in a process where fla-core cannot be imported, so
transformers runs its torch paths (prefill's ``torch_chunk_gated_delta_rule``); with
``@no-cudnn-sdp``: cuDNN's attention off (``benchmarks/_hf_sched.MODIFIERS``); ``kda@with-<rewrite>``:
kda with that rewrite's speed rule bypassed (a forced-only rewrite's whole-step A / B).

Issue 36: a figure a user will quote is the median over separate compiles, cold and warm.
Every variant is compiled ``--compiles`` times (3), variants alternating round by round (stock,
kda, kda-no-X, stock, kda, ...), **each compile in a fresh Python process**: what a restarted
server does. In one process a "warm" compile after ``torch._dynamo.reset()`` still finds the
previous compile's kernels in memory (``PyCodeCache``'s loaded modules, their already autotuned
``CachingAutotuner`` objects, Triton's in-memory kernel cache), which a restart does not have;
``--in-process`` keeps that mode for comparison. The first compile of each (family, case,
variant) gets an empty Inductor cache (``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR`` of
its own: FX graph cache, AOTAutograd cache, autotune results, compiled kernels), the others
read it; ``--caches`` changes that (``each-fresh``, ``disable``, ``no-autotune``) to tell the
causes of a warm-cache slowdown apart (docs/whole-step.md). ``fresh-inductor`` is ``fresh`` with
one Triton cache for the run (compiled binaries, and fla-core's autotune results through
``TRITON_CACHE_AUTOTUNING``): Inductor's caches and its autotune choices stay per variant and
empty at the first compile, but the eager fla-core prefill that builds each decode case's cache
no longer JIT-compiles and autotunes in every process (a cold compile's ``compile_s`` is then
lower than a first start's: Triton binaries of the same source are reused). kda compiles through
``torch.compile(backend="kda_inductor")`` with the caches on, as users do (``--via explain``:
through ``explain()``, graph caches off).

Each compile records: compile time, graphs and breaks, the FX graph / AOTAutograd cache
outcome, how often our pass ran and what it rewrote, the step's time (CUDA-graph replay,
``--replay-rounds`` rounds: the replay spread), the costliest kernels of three plain calls
(``torch.profiler``) with Inductor's launch config, registers, spills and autotune-cache state
of each of its Triton kernels, and the logits through the LM head against an fp32 copy of the
model (per-row max |difference|, argmax agreement). The table gives per variant the median over
its compiles, the spread across them, cold and warm apart.

One run, one commit: records go to the section of ``hf_models.{json,md}`` of this source
state and environment (``benchmarks/_hf_record.py``), written after every compile, so a call
stopped by ``--budget`` (no new compile after it) or a time limit keeps what it measured. A
tree without ``.git`` (the device tool's copy) names its commit through ``.hf_stamp.json``
(``--stamp``, run in the checkout). ``--plan`` estimates each (family, case) from the recorded
compile times and proposes a split into device calls; ``--merge`` joins the JSON copies that
several calls brought back.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import importlib
import os
import re
import statistics
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

_HERE = Path(__file__).resolve().parent
if str(_HERE.parent) not in sys.path:
    sys.path.insert(0, str(_HERE.parent))

from benchmarks import _hf_sched, _timing  # noqa: E402

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
STAGE = ("qwen3_next", "qwen3_5", "kimi_linear", "olmo_hybrid", "deepseek_v32")
"""The families of ``.ci/gpu hf`` (``--stage``, the default): GDN with MoE, GDN + dense MLP, KDA,
OLMo's GDN hybrid and the DeepSeek-V3.2 indexer; the others are run by name (``--family``)."""

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
SMOKE_LAYERS = 2
"""``benchmarks.hf_models --smoke`` builds 2 layers (one linear, one full): its compiles are what
the CPU suite waits for."""


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


def config_for(family: Family, config_cls, *, tiny: bool, layers: int = N_LAYERS):
    """The family's config: real or tiny dims, ``layers`` layers (the last one full attention in
    the linear families), few experts, small vocab, eager attention."""
    defaults = config_cls().to_dict()
    kw = dict(family.dims)
    if tiny:
        kw.update({k: v for k, v in TINY.items() if k in defaults and (k != "q_lora_rank" or defaults[k])})
        if "kv_lora_rank" in defaults:  # MLA: one KV head per query head
            kw["num_key_value_heads"] = kw["num_attention_heads"]
    kw["num_hidden_layers"] = layers
    kw["vocab_size"] = TINY_VOCAB if tiny else VOCAB
    for key in ("num_experts", "n_routed_experts"):
        if key in defaults:
            kw[key] = TINY_EXPERTS if tiny else N_EXPERTS
    if family.kind == "linear":
        kw["layer_types"] = [LINEAR] * (layers - 1) + [family.full_type]
    else:
        kw["layer_types"] = [defaults["layer_types"][0]] * layers
    if "mlp_layer_types" in defaults:
        kw["mlp_layer_types"] = ["dense"] + ["sparse"] * (layers - 1)
    if "first_k_dense_replace" in defaults:
        kw["first_k_dense_replace"] = 1
    if "indexer_types" in defaults:
        kw["indexer_types"] = [defaults["indexer_types"][0]] * layers
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


def build(family: Family, *, tiny: bool, device: str, dtype=torch.bfloat16, seed: int = 0, layers: int = N_LAYERS):
    """``(model, config)`` of the family with random weights, in eval mode; None if missing."""
    loaded = load(family)
    if loaded is None:
        return None
    config_cls, model_cls, modeling = loaded
    if device == "cpu":
        use_torch_cores(modeling)
    torch.manual_seed(seed)
    config = config_for(family, config_cls, tiny=tiny, layers=layers)
    # on a GPU the random init runs there (seconds, not a CPU minute for the large families; the
    # same weights in every process of a run)
    with warnings.catch_warnings(), torch.device(device) if device != "cpu" else contextlib.nullcontext():
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


# --------------------------------------------------------------------------- one compile


def report_summary(report) -> dict[str, Any]:
    """explain()'s rewrite table, its shown misses as text lines, the rewrites that failed (and
    why), the graph breaks and the frames that fell back to eager, each with its reason."""
    misses = [line.strip() for line in report.misses_text() if line.strip()]
    errors = {name: err for g in report.graphs for name, err in g.errors.items()}
    return {"matches": dict(report.matches), "traced": dict(report.traced),
            "trace_misses": [str(m) for m in report.trace_misses], "misses": misses, "errors": errors,
            "graph_breaks": [f"{b.count}x {b.reason}" for b in report.graph_breaks],
            "eager_frames": [f"{f.name} ({f.location}): {f.reason}" for f in report.eager_frames]}


def kda_compile(decoder, call: Callable, options: dict | None):
    """``decoder`` compiled with kda_inductor through ``kda_inductor.Explainer`` (which calls it
    once on ``call``'s inputs, Inductor's graph caches off): ``(zero-argument compiled step,
    report)``. The cache's host-side reset stays outside the compiled code."""
    import kda_inductor

    report = kda_inductor.Explainer(options=options)(decoder, **call.inputs())
    return (lambda: call(report.compiled)), report


STOCK_FIX = "stock+fix"
"""Stock Inductor with kda_inductor's ``is_exporting()`` fix applied to its traces
(``_dynamo_fixes.applied_to_every_backend``): what the fix gives, apart from the rewrites. Run only
where this torch folds the constant (torch <= 2.12); on a torch that has the fix it is stock."""


def variants_for(requested: list[str] | None, fired: dict[str, int] | None) -> list[str]:
    """The compiled variants of a case, in order: stock, stock+fix (where this torch needs the
    fix), kda, then kda-no-<rewrite> for every registered rewrite that fired in kda (``fired``:
    kda's matches; None before kda ran). ``requested`` narrows them (``--variant``; a
    kda-no-<rewrite> named there runs whether or not kda ran first)."""
    from kda_inductor import _dynamo_fixes

    out = ["stock"] + ([STOCK_FIX] if _dynamo_fixes.torch_folds_is_exporting() else []) + ["kda"]
    out += [f"kda-no-{name}" for name, n in (fired or {}).items() if n]
    out += [v for v in requested or () if v.startswith("kda-no-") and v != "kda-no-*" and v not in out]
    out += [v for v in requested or () if _hf_sched.modified(v) and v not in out]
    return [v for v in out if requested is None or v in requested or
            (v.startswith("kda-no-") and "kda-no-*" in requested)]


def _kda_options(variant: str, options: dict | None) -> dict | None:
    """``options`` for kda_inductor with ``kda-no-<rewrite>``'s rewrite disabled."""
    opts, variant = dict(options or {}), _hf_sched.base_variant(variant)
    if variant.startswith("kda-no-"):
        opts["kda"] = {**opts.get("kda", {}), "disable": [variant.removeprefix("kda-no-")]}
    return opts or None


def compile_variant(variant: str, decoder, call: Callable, options: dict | None, *, via: str = "compile"):
    """``(zero-argument step, explain() report or None)`` of one variant, called once (the
    compile; eager: a plain call). kda variants compile as a user does,
    ``torch.compile(decoder, backend="kda_inductor")`` with Inductor's caches as configured
    (``via="compile"``), or through ``explain()`` (``via="explain"``: graph caches off, the
    misses recorded)."""
    from kda_inductor import _dynamo_fixes

    variant = _hf_sched.base_variant(variant)  # its modifiers: the worker's business
    if variant == "eager":
        step = lambda: call(decoder)  # noqa: E731
        step()
        return step, None
    if variant in ("stock", STOCK_FIX):
        compiled = torch.compile(decoder, backend="inductor")
        step = lambda: call(compiled)  # noqa: E731
        with _dynamo_fixes.applied_to_every_backend() if variant == STOCK_FIX else contextlib.nullcontext():
            step()
        return step, None
    opts = _kda_options(variant, options)
    if via == "explain":
        return kda_compile(decoder, call, opts)
    compiled = torch.compile(decoder, backend="kda_inductor", options=opts)
    step = lambda: call(compiled)  # noqa: E731
    step()
    return step, None


def _cache_counters() -> dict[str, int]:
    """Inductor's FX graph cache and AOTAutograd's cache outcomes so far (``counters``)."""
    from torch._dynamo.utils import counters

    out = {f"fx_{k.removeprefix('fxgraph_cache_')}": v for k, v in counters["inductor"].items()
           if k.startswith("fxgraph_cache_")}
    out.update({f"aot_{k.removeprefix('autograd_cache_')}": v for k, v in counters["aot_autograd"].items()
                if k.startswith("autograd_cache_")})
    return out


def inductor_kernels() -> dict[str, dict[str, Any]]:
    """Every Triton kernel Inductor loaded in this process (the output code's
    ``CachingAutotuner`` objects): name -> heuristic, the config it launches with (after
    autotuning), the autotune cache's state, registers and spills, and its source file's
    hash (the code-cache key). Call after the compiled step ran: autotuning happens on the
    first call."""
    try:
        from torch._inductor.codecache import PyCodeCache
        from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    except ImportError:  # pragma: no cover - a torch without them
        return {}
    modules = list(getattr(PyCodeCache, "modules", [])) + list(getattr(PyCodeCache, "modules_no_attr", {}).values())
    out: dict[str, dict[str, Any]] = {}
    for mod in modules:
        for value in list(vars(mod).values()):
            if isinstance(value, CachingAutotuner):
                name = (getattr(value, "inductor_meta", None) or {}).get("kernel_name") or \
                    getattr(getattr(value, "fn", None), "__name__", None)
                info = _kernel_info(value)
                # a kernel's own module holds an autotuner that never ran; the output code's ran
                if name and ("config" in info or "config" not in out.get(name, {})):
                    out[name] = info
    return out


def _kernel_info(autotuner) -> dict[str, Any]:
    """One ``CachingAutotuner``'s launch config and how it was chosen."""
    launchers = getattr(autotuner, "launchers", None) or []
    info: dict[str, Any] = {"heuristic": str(getattr(autotuner, "heuristic_type", "")).split(".")[-1],
                            "src": Path(getattr(autotuner, "filename", "") or "").stem[:16] or None,
                            "launchers": len(launchers)}
    cache_info = getattr(autotuner, "autotune_cache_info", None) or {}
    info["autotune_cache"] = cache_info.get("autotune_cache_state")
    info["configs_tried"] = cache_info.get("num_configs")
    if len(launchers) == 1:
        launcher = launchers[0]
        cfg = launcher.config
        info["config"] = {**dict(cfg.kwargs), "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
        info["n_regs"], info["n_spills"] = getattr(launcher, "n_regs", None), getattr(launcher, "n_spills", None)
    return info


def _top_kernels(step: Callable, device: str, *, keep: int = 12) -> list[dict[str, Any]]:
    """The ``keep`` costliest kernels of three plain calls of ``step`` (``torch.profiler``), us
    per call, with Inductor's launch config and autotune outcome where the kernel is one of its
    Triton kernels."""
    per_kernel = _timing.kernel_profile(step, calls=3, warmup=1, device=device)
    known = inductor_kernels()
    top = sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[:keep]
    return [{"kernel": name[:120], "us": round(us, 1), "calls": n, **known.get(name, {})} for name, (us, n) in top]


def logits_numerics(model, hidden: torch.Tensor, reference: torch.Tensor) -> dict[str, Any]:
    """Logits of ``hidden`` through the model's own LM head against the fp32 copy's: per row
    (a sequence's token, or a prefill position) the max |difference| over the vocabulary, its
    median and max over the rows, and the share of rows whose argmax agrees."""
    with torch.inference_mode():
        logits = model.lm_head(hidden).float()
    rows, ref = logits.reshape(-1, logits.shape[-1]), reference.reshape(-1, reference.shape[-1]).to(logits.device)
    diff = (rows - ref).abs().amax(-1)
    return {"rows": rows.shape[0], "max_diff_median": diff.median().item(), "max_diff_max": diff.max().item(),
            "argmax_agree": (rows.argmax(-1) == ref.argmax(-1)).float().mean().item()}


def reference_logits(model, config, case: str, *, smoke: bool, device: str) -> torch.Tensor:
    """The logits of ``case``'s step on an fp32 copy of ``model`` (eager, its own cache)."""
    ref = copy.deepcopy(model).float()
    call, reset = make_case(ref, config, case, smoke=smoke, device=device)
    with torch.inference_mode():
        reset()
        logits = ref.lm_head(call(ref.model)).float()
    del ref
    if device == "cuda":
        torch.cuda.empty_cache()
    return logits


def _reference(spec: dict[str, Any], model, config) -> tuple[torch.Tensor, str, str | None]:
    """The fp32 copy's logits of this case: computed by the case's first compile and kept in
    ``spec["reference_path"]`` (beside its caches) for the others (the same weights: one seed).
    Where fla-core is importable on CUDA, a child process computes it with fla-core hidden
    (:func:`reference_worker`): transformers' torch code in float32, not fla's kernels (which
    autotune again in float32, round through tf32 products, and do not fit Kimi Linear's
    float32 prefill in shared memory); in this process where that child fails. Also returns
    what computed it: "torch" (no fla-core) or "fla-core", and why the child failed (or None)."""
    path = Path(spec["reference_path"]) if spec.get("reference_path") else None
    failed = None
    if path is not None and not path.exists() and _fla_visible() and spec["device"] == "cuda":
        failed = _reference_child(spec, model)
    if path is not None and path.exists():
        by = path.with_suffix(".by")
        return torch.load(path, map_location=spec["device"]), by.read_text() if by.exists() else "?", failed
    logits = reference_logits(model, config, spec["case"], smoke=spec["smoke"], device=spec["device"])
    by = "fla-core" if _fla_visible() and spec["device"] == "cuda" else "torch"
    if path is not None:
        _save_whole(logits, path, by)
    return logits, by, failed


def _save_whole(logits: torch.Tensor, path: Path, by: str) -> None:
    """Written whole or not at all (another compile of the run may read it next), what computed
    it beside it (``.by``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".by").write_text(by)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    torch.save(logits, tmp)
    os.replace(tmp, path)


def _fla_visible() -> bool:
    """Whether this process can import fla-core (not hidden by ``@no-fla``)."""
    import importlib.util
    import sys

    if "fla" in sys.modules:
        return sys.modules["fla"] is not None
    return importlib.util.find_spec("fla") is not None


def _reference_child(spec: dict[str, Any], model) -> str | None:
    """:func:`reference_worker` in a fresh process (its output to this one's log), handed this
    process's weights (whatever the model's init does without fla-core, its weights are these);
    why it left no logits (its exit, its last error line), or None."""
    import json
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="hf_reference_") as tmp:
        spec_path, weights = Path(tmp) / "spec.json", Path(tmp) / "weights.pt"
        torch.save(model.state_dict(), weights)
        spec_path.write_text(json.dumps({**spec, "reference_only": True, "weights": str(weights),
                                         "out": str(Path(tmp) / "record.json")}))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(_HERE.parent),
                                                                          os.environ.get("PYTHONPATH")]))}
        try:
            done = subprocess.run([sys.executable, "-m", "benchmarks.hf_models", "--worker", str(spec_path)], env=env,
                                  cwd=_HERE.parent, timeout=600, check=False, stderr=subprocess.PIPE, text=True)
        except subprocess.TimeoutExpired:
            print("    the fp32 reference's process ran past 600 s: computed in this one", flush=True)
            return "ran past 600 s"
        if Path(spec["reference_path"]).exists():
            return None
        record = Path(tmp) / "record.json"
        said = json.loads(record.read_text()).get("error") if record.exists() else None
        errors = [ln for ln in (done.stderr or "").splitlines() if "Error" in ln or "error" in ln]
        why = f"exit {done.returncode}: " + str(said or (errors[-1] if errors else "no error line"))[:200]
        print(f"    the fp32 reference's process left no logits ({why}): computed in this one", flush=True)
        return why


def reference_worker(spec: dict[str, Any]) -> dict[str, Any]:
    """The fp32 reference of ``spec``'s case with fla-core hidden: the model built as a compile
    builds it (one seed, the same dtype; ``spec["weights"]``: the compile's weights loaded), copied
    to float32, its step run eagerly."""
    t0 = time.perf_counter()
    if err := _hf_sched.hide_fla():
        return {"error": err}
    family, device, smoke = BY_NAME[spec["family"]], spec["device"], spec["smoke"]
    if load(family) is None:
        return {"error": "not in this transformers"}
    dtype = torch.float32 if smoke and family.kind == "indexer" else torch.bfloat16
    model, config = build(family, tiny=smoke, device=device, dtype=dtype, layers=SMOKE_LAYERS if smoke else N_LAYERS)
    if spec.get("weights"):  # the compile's own weights; a module that differs without fla-core fails here
        model.load_state_dict(torch.load(spec["weights"], map_location=device), strict=True)
    _save_whole(reference_logits(model, config, spec["case"], smoke=smoke, device=device),
                Path(spec["reference_path"]), "torch")
    return {"reference": spec["reference_path"], "s": round(time.perf_counter() - t0, 1)}


CASES = ("decode32", "decode128", "prefill", "prefill1024")
TABLE_CASES = CASES[:3]
"""The table's cases (the default); ``prefill1024``: a shorter prefill, for a speed rule's A / B at
another size (``kda@with-gdn_chunk``)."""
TABLE_CASES_OF = {"deepseek_v32": ("decode32",)}
"""Families whose table cells are fewer than ``TABLE_CASES`` (``--plan`` without ``--case``): the
indexer family's one cell is decode 32 (nothing fires there: the check that nothing is slower). Its
prefill 4096 replays take 98-134 ms (40-75 s of GPU a variant on an H100, 2026-12-08) and its decode
128 is no GDN / KDA cell; both still run by name (``--case``)."""
SMOKE_SHAPES = {"decode32": ("decode", 2, 8), "decode128": ("decode", 3, 8), "prefill": ("prefill", 1, 16),
                "prefill1024": ("prefill", 1, 12)}
REAL_SHAPES = {"decode32": ("decode", 32, 256), "decode128": ("decode", 128, 256), "prefill": ("prefill", 1, 4096),
               "prefill1024": ("prefill", 1, 1024)}


def case_label(case: str, *, smoke: bool) -> str:
    kind, batch, size = (SMOKE_SHAPES if smoke else REAL_SHAPES)[case]
    return f"decode {batch} x 1 (cache {size})" if kind == "decode" else f"prefill {batch} x {size}"


def make_case(model, config, case: str, *, smoke: bool, device: str):
    """``(step, reset)`` of ``case`` (``CASES``) at the real or smoke shapes."""
    kind, batch, size = (SMOKE_SHAPES if smoke else REAL_SHAPES)[case]
    if kind == "decode":
        return decode_case(model, config, batch=batch, context=size, device=device)
    return prefill_case(model, config, tokens=size, device=device)


def _timed_replays(step: Callable, device: str, rounds: int) -> tuple[list[float], str]:
    """``rounds`` samples of the step's time: CUDA-graph replay medians where capture works,
    else CUDA-event medians of plain calls; CPU: wall clock (not meaningful)."""
    if device != "cuda":
        return [_timing.perf_counter_median_us(step, reps=1) for _ in range(rounds)], "cpu-wall"
    try:
        graph, _out = _timing.capture_graph(step, warmup=3)
        return [_timing.replay_median_us([graph], reps=20, inner=5) for _ in range(rounds)], "graph"
    except Exception as err:  # capture failed (host sync, dynamic allocation): time plain calls
        torch.cuda.synchronize()
        print(f"    CUDA graph capture failed ({type(err).__name__}: {str(err)[:120]}); timing with events", flush=True)
        return [_timing.eager_median_us(step, reps=10, warmup=2) for _ in range(rounds)], "events"


def run_compile(spec: dict[str, Any]) -> dict[str, Any]:
    """One compile of one variant of one case, and what it measures: compile time, cache
    outcomes, our pass's matches, the step's time (``replay_rounds`` samples: the replay
    spread), the costliest kernels with their launch configs, and the logits against an fp32
    copy of the model. ``spec``: family, case, variant, smoke, device, options, via,
    replay_rounds, numerics, profile, autotune_cache. Raises on a failed ``check`` (smoke)."""
    import torch._inductor.config as inductor_config

    from kda_inductor import pass_manager
    from torch._dynamo.utils import counters

    t0 = time.perf_counter()
    family, device, smoke = BY_NAME[spec["family"]], spec["device"], spec["smoke"]
    if spec.get("autotune_cache") is False:
        inductor_config.autotune_local_cache = False
    # the run's GPU lock (--jobs > 1): held while the case is set up on the GPU, given back
    # while Dynamo and Inductor compile, taken again when the compile ends (benchmarks/_hf_sched.py)
    lock = _hf_sched.GpuLock(spec.get("gpu_lock"))
    dtype = torch.float32 if smoke and family.kind == "indexer" else torch.bfloat16
    record: dict[str, Any] = {}
    reference = None
    if err := _hf_sched.apply_modifiers(spec["variant"]):  # before transformers looks for fla-core
        return {"error": err}
    # before the lock: what runs no kernel (transformers' modeling import, the CUDA context)
    if load(family) is None:
        return {"error": "not in this transformers"}
    if device == "cuda":
        torch.cuda.init()
        torch.cuda.current_blas_handle()
    memory = _hf_sched.GpuMemory(spec["gpu_lock"] + ".mem.json" if spec.get("gpu_lock") and device == "cuda" else None)
    memory_key = f"{spec['family']}/{spec['case']}"
    with lock.during():
        if memory.path:  # the model built on the GPU only once its memory fits beside the others'
            record["memory_wait_s"] = round(memory.admit(lock, memory_key, torch.cuda.mem_get_info()[1]), 1)
        t_setup = time.perf_counter()
        built = build(family, tiny=smoke, device=device, dtype=dtype, layers=SMOKE_LAYERS if smoke else N_LAYERS)
        if built is None:
            return {"error": "not in this transformers"}
        model, config = built
        record["build_s"] = round(time.perf_counter() - t_setup, 1)
        if spec.get("numerics", True):
            try:
                reference, record["reference_by"], failed = _reference(spec, model, config)
                if failed:
                    record["reference_child"] = failed
            except Exception as err:  # noqa: BLE001 - the timing stands without the check
                record["numerics_error"] = f"{type(err).__name__}: {str(err)[:300]}"
        t_case = time.perf_counter()
        call, reset = make_case(model, config, spec["case"], smoke=smoke, device=device)
        record["case_s"] = round(time.perf_counter() - t_case, 1)  # the prefill that fills a decode case's cache
        torch._dynamo.reset()
        counters.clear()
        expected = None
        if spec.get("check"):
            with torch.inference_mode():
                reset()
                expected = call(model.model).clone()
        if device == "cuda":
            torch.cuda.synchronize()
        record["setup_s"] = round(time.perf_counter() - t_setup, 1)  # GPU-locked: build_s, the reference, case_s
    with torch.inference_mode(), pass_manager.counted() as made, pass_manager.timed() as runs, \
            pass_manager.observe() as observed:
        reset()
        if _hf_sched.base_variant(spec["variant"]) == "eager":  # no compile: GPU work from its start
            lock.acquire()
        waited = lock.waited
        t_compile = time.perf_counter()
        with lock.from_compile_end():
            step, report = compile_variant(spec["variant"], model.model, call, spec.get("options"),
                                           via=spec.get("via"))
            if device == "cuda":
                torch.cuda.synchronize()
        # what a user waits for: the first call, less the time this process queued for the GPU
        record["compile_s"] = time.perf_counter() - t_compile - (lock.waited - waited)
    record.update(_compile_facts(spec["variant"], report, made, runs, observed))
    t_measure = time.perf_counter()
    with torch.inference_mode():
        reset()
        out = step()
        if expected is not None:
            from kda_inductor.testing import assert_close_to_eager

            assert_close_to_eager(out, expected, rtol=0.05, atol=0.05)
        if reference is not None:
            try:
                record["numerics"] = logits_numerics(model, out, reference)
            except Exception as err:  # noqa: BLE001
                record["numerics_error"] = f"{type(err).__name__}: {str(err)[:300]}"
        samples, record["timing"] = _timed_replays(step, device, spec.get("replay_rounds", 3))
        record["replays_us"] = samples
        record["us"] = statistics.median(samples)
        record["replay_spread"] = (max(samples) - min(samples)) / record["us"] if record["us"] else None
        if spec.get("profile", True):
            try:
                record["kernels"] = _top_kernels(step, device)
                if spec.get("all_kernels"):
                    record["all_triton"] = inductor_kernels()
            except Exception as err:  # noqa: BLE001 - the timing stands without the table
                record["kernels_error"] = f"{type(err).__name__}: {str(err)[:300]}"
    record["measure_s"] = round(time.perf_counter() - t_measure, 1)  # numerics, replays, profile
    if spec.get("gpu_lock"):
        record["lock_wait_s"], record["gpu_s"] = round(lock.waited, 1), round(lock.held(), 1)
    if memory.path:
        memory.done(memory_key, torch.cuda.max_memory_reserved() + (1 << 30))  # + the context's
    lock.release()
    record["wall_s"] = time.perf_counter() - t0
    return record


def _compile_facts(variant: str, report, made: dict, runs: list, observed: list) -> dict[str, Any]:
    """What a compile was: graphs and breaks, cache outcomes, how often our pass ran and what
    it rewrote (nothing where a cache served the graph), its failures; explain()'s summary
    where the kda variant went through it."""
    from torch._dynamo.utils import counters

    facts: dict[str, Any] = {"graphs": counters["stats"].get("unique_graphs"),
                             "breaks": sum(counters["graph_break"].values()), "caches": _cache_counters()}
    if variant.startswith("kda"):
        from kda_inductor._explain import traced_ops

        facts["pass_runs"] = len(runs)
        facts["matches"] = dict(made)
        facts["traced"] = traced_ops(observed)
        errors = {name: err for r in observed for name, err in r.errors.items()}
        if errors:
            facts["rewrite_errors"] = errors
    if report is not None:
        facts.update({k: v for k, v in report_summary(report).items() if k != "matches"})
        facts["matches"] = {k: v for k, v in report.matches.items() if v}
    return facts


# --------------------------------------------------------------------------- the compiles of a case


@dataclasses.dataclass
class RunSettings:
    """How a run compiles: ``compiles`` per variant; ``caches``: ``fresh`` (the first compile of
    each variant on an empty Inductor cache, the others reading it: a restarted server),
    ``fresh-inductor`` (``fresh``, one Triton cache for the run: module docstring),
    ``each-fresh`` (every compile on an empty cache), ``disable``
    (``TORCHINDUCTOR_FORCE_DISABLE_CACHES=1``), ``no-autotune`` (``fresh``, but Inductor's
    autotune results not cached); ``in_process``: compile in this process (dynamo reset between
    compiles) instead of a fresh process per compile; ``budget``: seconds after which no new
    compile starts (a running one gets ``grace`` more); ``recipe``: which compiles each variant
    gets (``benchmarks/_hf_sched.py``: ``rounds`` or ``table``); ``jobs``: compile processes at
    once, the GPU phases one at a time under the run's lock; ``compile_limit``: seconds a compile's
    process may run (a compile that takes longer is recorded as failed, with the limit)."""

    smoke: bool = False
    device: str = "cuda"
    compiles: int = 3
    caches: str = "fresh"
    in_process: bool = False
    via: str = "compile"
    replay_rounds: int = 3
    numerics: bool = True
    profile: bool = True
    all_kernels: bool = False
    budget: float | None = None
    grace: float = 150.0
    cache_root: str | None = None
    options: dict | None = None
    recipe: str = "rounds"
    jobs: int = 1
    compile_limit: float | None = None


CACHE_MODES = ("fresh", "fresh-inductor", "each-fresh", "disable", "no-autotune")


def cache_state(settings: RunSettings, round_: int, variant: str = "kda") -> str:
    """What compile ``round_`` of ``variant`` reads: ``cold`` (an empty cache), ``warm`` (the one
    its variant's first compile filled), ``disabled``, or ``-`` (eager)."""
    states = _hf_sched.round_states(settings.recipe, settings.compiles, variant, settings.caches)
    return states[min(round_, len(states) - 1)]


def _cache_env(settings: RunSettings, family: str, case: str, variant: str, round_: int) -> dict[str, str]:
    """The environment of one compile: its Inductor and Triton cache directories (one per
    family, case and variant, made empty for a cold compile; a cold compile after the first
    gets a fresh one of its own), caches off for ``disable``."""
    import shutil

    state = cache_state(settings, round_, variant)
    folder = Path(settings.cache_root) / family / case / variant.replace("+", "_")
    if settings.caches in ("each-fresh", "disable") or (state == "cold" and round_ > 0):
        folder = folder / f"c{round_}"
    if state != "warm" and folder.exists():  # set aside first: a killed compile's workers may still write in it
        aside = folder.with_name(f"{folder.name}.old{os.getpid()}.{time.monotonic_ns()}")
        folder.rename(aside)
        shutil.rmtree(aside, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    triton = Path(settings.cache_root) / "triton" if settings.caches == "fresh-inductor" else folder / "triton"
    env = {"TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor"), "TRITON_CACHE_DIR": str(triton)}
    if settings.caches == "fresh-inductor":  # fla-core's eager kernels: compiled and autotuned once per run
        env["TRITON_CACHE_AUTOTUNING"] = "1"
    if settings.caches == "disable":
        env["TORCHINDUCTOR_FORCE_DISABLE_CACHES"] = "1"
    threads = _hf_sched.compile_threads(settings.jobs)
    if threads:
        env["TORCHINDUCTOR_COMPILE_THREADS"] = threads
    return env


def _spec(settings: RunSettings, family: str, case: str, variant: str, round_: int) -> dict[str, Any]:
    return {"family": family, "case": case, "variant": variant, "round": round_, "smoke": settings.smoke,
            "device": settings.device, "options": settings.options, "via": settings.via,
            "replay_rounds": settings.replay_rounds, "numerics": settings.numerics, "profile": settings.profile,
            "all_kernels": settings.all_kernels, "check": settings.smoke,
            "reference_path": str(Path(settings.cache_root) / family / case / "fp32_logits.pt"),
            "autotune_cache": settings.caches != "no-autotune",
            "gpu_lock": str(Path(settings.cache_root) / "gpu.lock") if settings.jobs > 1 else None}


def compile_once(settings: RunSettings, spec: dict[str, Any], env: dict[str, str], timeout: float) -> dict[str, Any]:
    """``run_compile(spec)`` in a fresh Python process (or this one, ``in_process``) with
    ``env``; its record, or ``{"error": ...}`` (a failure, the time limit)."""
    import json
    import os
    import subprocess
    import tempfile

    if settings.in_process:
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            return run_compile(spec)
        finally:
            for k, v in saved.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    with tempfile.TemporaryDirectory(prefix="hf_compile_") as tmp:
        spec_path, out_path, log_path = (Path(tmp) / n for n in ("spec.json", "record.json", "log.txt"))
        spec_path.write_text(json.dumps({**spec, "out": str(out_path)}))
        cmd = [sys.executable, "-m", "benchmarks.hf_models", "--worker", str(spec_path)]
        full_env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join(filter(None, [str(_HERE.parent),
                                                                                     os.environ.get("PYTHONPATH")]))}
        try:
            with log_path.open("w") as log:
                proc = subprocess.run(cmd, env=full_env, cwd=_HERE.parent, stdout=log, stderr=subprocess.STDOUT,
                                      timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            return {"error": f"killed after {timeout:.0f} s (the run's budget + grace)"}
        if proc.returncode != 0 or not out_path.exists():
            tail = log_path.read_text()[-3000:]
            print(tail, flush=True)
            return {"error": f"worker exit {proc.returncode}: {tail.strip().splitlines()[-1][:300] if tail.strip() else ''}"}
        return json.loads(out_path.read_text())


def worker_main(spec_path: str) -> None:
    """``--worker SPEC``: run one compile (``run_compile``) and write its record to spec's
    ``out``."""
    import json

    spec = json.loads(Path(spec_path).read_text())
    record = reference_worker(spec) if spec.get("reference_only") else run_compile(spec)
    Path(spec["out"]).write_text(json.dumps(record, default=str))


class Budget:
    """Seconds left before a run's ``budget``: nothing new starts after it."""

    def __init__(self, seconds: float | None, grace: float):
        self.start, self.seconds, self.grace = time.perf_counter(), seconds, grace

    def spent(self) -> bool:
        return self.seconds is not None and time.perf_counter() - self.start >= self.seconds

    def timeout(self) -> float:
        """How long a compile started now may run."""
        if self.seconds is None:
            return 3600.0
        return self.seconds + self.grace - (time.perf_counter() - self.start)


def run_compiles(settings: RunSettings, cases: list[tuple[str, str]], requested: list[str] | None,
                 budget: Budget, sink: Callable[[dict], None]) -> list[str]:
    """Every compile of every (family, case) in ``cases`` (``settings.recipe``), ``settings.jobs``
    at a time (``benchmarks/_hf_sched.py``); each compile's record goes to ``sink`` as it
    finishes. The rewrites that fired in kda's first compile (an empty cache: our pass ran) add
    their kda-no-<rewrite> compiles. Returns what was never started (the budget)."""
    fired: dict[tuple[str, str], list[str]] = {}
    index = {fc: i for i, fc in enumerate(cases)}
    lock = threading.Lock()

    def jobs_of(family: str, case: str, variants: list[str]) -> list[_hf_sched.Job]:
        return _hf_sched.case_jobs(family, case, index[(family, case)], variants, settings.recipe,
                                   settings.compiles, settings.caches, fired.get((family, case), []))

    def run(job: _hf_sched.Job) -> dict:
        return _compile_and_record(settings, job.family, job.case, job.variant, job.round, budget)

    def on_done(job: _hf_sched.Job, record: dict) -> list[_hf_sched.Job]:
        with lock:
            sink(record)
            if job.variant != "kda" or job.round != 0 or (job.family, job.case) in fired or not record.get("pass_runs"):
                return []
            names = [k for k, v in (record.get("matches") or {}).items() if v]
            if settings.recipe == "table":  # the table's one: the rewrite that matters most there
                names = [n for n in names if n == TABLE_KEY_REWRITE["prefill" if job.case.startswith("prefill")
                                                                    else "decode"]]
            fired[(job.family, job.case)] = names
            extra = [v for v in variants_for(requested, dict.fromkeys(names, 1))
                     if v.startswith("kda-no-") and v not in planned[(job.family, job.case)]]
            return jobs_of(job.family, job.case, extra)

    planned = {}
    initial = []
    for family, case in cases:
        variants = (["eager"] if requested is None or "eager" in requested else []) + variants_for(requested, None)
        planned[(family, case)] = set(variants)
        initial += jobs_of(family, case, variants)
    missed = _hf_sched.Scheduler(run, on_done, budget.spent, settings.jobs)(initial)
    out = [f"{j.family} {j.case} {j.variant} #{j.round + 1}" for j in missed]
    for family, case in cases:
        if (family, case) not in fired and requested is not None and "kda-no-*" in requested:
            out.append(f"{family} {case} kda-no-* (kda's first compile did not report its rewrites)")
    return out


def _compile_and_record(settings: RunSettings, family: str, case: str, variant: str, round_: int,
                        budget: Budget) -> dict[str, Any]:
    """One compile (``compile_once``) and its record, labelled, its progress line printed."""
    env = _cache_env(settings, family, case, variant, round_)
    limit = settings.compile_limit
    timeout = budget.timeout() if limit is None else min(limit, budget.timeout())
    record = compile_once(settings, _spec(settings, family, case, variant, round_), env, timeout)
    if limit is not None and timeout == limit and str(record.get("error", "")).startswith("killed after"):
        record.update(error=f"did not finish within --compile-limit {limit:.0f} s (compile, replay and checks)",
                      compile_limit_s=limit)
    record.update(family=family, case=case, variant=variant, round=round_,
                  cache=cache_state(settings, round_, variant))
    _timing.progress({k: record.get(k) for k in ("family", "case", "variant", "round", "cache", "us", "replay_spread",
                                               "compile_s", "lock_wait_s", "gpu_s", "caches", "matches", "error")
                      if k in record})
    return record


# --------------------------------------------------------------------------- summaries


VARIANT_ORDER = ["eager", "stock", STOCK_FIX, "kda"]


def _variant_rank(variant: str) -> tuple:
    return (VARIANT_ORDER.index(variant), "") if variant in VARIANT_ORDER else (len(VARIANT_ORDER), variant)


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _group(records: list[dict]) -> dict[tuple, list[dict]]:
    """Records by (family, case, mode, variant), in family, case and variant order."""
    order = {f.name: i for i, f in enumerate(FAMILIES)}
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r.get("family"), r.get("case"), r.get("mode", ""), r.get("variant")), []).append(r)
    return dict(sorted(groups.items(), key=lambda kv: (order.get(kv[0][0], 99), CASES.index(kv[0][1])
                                                       if kv[0][1] in CASES else 9, kv[0][2], _variant_rank(kv[0][3]))))


def summarize(records: list[dict]) -> list[dict]:
    """One row per (family, case, mode, variant): the median over its compiles, the spread
    across them ((max - min) / median), cold and warm apart, the largest replay spread of a
    compile, compile times, cache outcomes, logits against fp32, and ratios to stock,
    stock+fix and (kda-no-<rewrite>) kda."""
    rows = [_summary_row(key, group) for key, group in _group(records).items()]
    by_key = {(r["family"], r["case"], r["mode"], r["variant"]): r for r in rows}
    for r in rows:
        for col, base in (("vs_stock", "stock"), ("vs_stock_fix", STOCK_FIX), ("vs_kda", "kda")):
            other = by_key.get((r["family"], r["case"], r["mode"], base))
            applies = base != "kda" or r["variant"].startswith("kda-no-") or _hf_sched.base_variant(r["variant"]) == "kda"
            ok = applies and other and other["us"] and r["us"] is not None and r["variant"] != base
            r[col] = r["us"] / other["us"] if ok else None
    return rows


def _summary_row(key: tuple, group: list[dict]) -> dict[str, Any]:
    family, case, mode, variant = key
    ok = sorted([r for r in group if r.get("us") is not None], key=lambda r: r.get("round", 0))
    us = [r["us"] for r in ok]
    cold = [r["us"] for r in ok if r.get("cache") in ("cold", "-", "disabled")]
    warm = [r["us"] for r in ok if r.get("cache") == "warm"]
    med = _median(us)
    errors = [r["error"] for r in group if r.get("error")]
    row = {"family": family, "case": case, "mode": mode, "variant": variant, "label": group[0].get("label", case),
           "compiles": f"{len(ok)}" + (f" (+{len(errors)} failed)" if errors else ""),
           "us": med, "spread": (max(us) - min(us)) / med if len(us) > 1 and med else None,
           "cold_us": cold[0] if cold else None, "warm_us": _median(warm),
           "replay_spread": max((r.get("replay_spread") or 0.0 for r in ok), default=None) if ok else None,
           "compile_s": _compile_text(ok), "caches": " ".join(_cache_letter(r) for r in ok) or "-",
           "error": errors[0][:200] if errors else None,
           "limited_s": min((limited_s(r) for r in group if limited_s(r)), default=None)}
    row.update(_numerics_cells(ok))
    pass_ran = [r for r in ok if r.get("pass_runs")]
    row["rewrites"] = ", ".join([f"{k} {v}" for k, v in (pass_ran[0].get("matches") or {}).items() if v]
                                + [f"{k} {v} (traced)" for k, v in (pass_ran[0].get("traced") or {}).items()]) \
        if pass_ran else ("-" if variant.startswith("kda") else "")
    row["top_kernel"] = _top_kernel_text(ok)
    return row


def _compile_text(records: list[dict]) -> str:
    cold = [r["compile_s"] for r in records if r.get("cache") != "warm" and r.get("compile_s") is not None]
    warm = [r["compile_s"] for r in records if r.get("cache") == "warm" and r.get("compile_s") is not None]
    parts = [f"{cold[0]:.0f}" if cold else "-", f"{_median(warm):.0f}" if warm else "-"]
    return " / ".join(parts)


def _cache_letter(record: dict) -> str:
    """A compile's FX graph cache outcome: H (hit), M (miss), B (bypass), - (no compile)."""
    caches = record.get("caches") or {}
    if caches.get("fx_hit"):
        return "H" + ("+M" if caches.get("fx_miss") else "")
    if caches.get("fx_miss"):
        return "M"
    return "B" if caches.get("fx_bypass") else "-"


def _numerics_cells(records: list[dict]) -> dict[str, Any]:
    nums = [r["numerics"] for r in records if r.get("numerics")]
    if not nums:
        return {"logits": None, "argmax": None}
    by = sorted({r["reference_by"] for r in records if r.get("numerics") and r.get("reference_by")})
    return {"logits": f"{_median([n['max_diff_median'] for n in nums]):.3g} / "
                      f"{max(n['max_diff_max'] for n in nums):.3g}" + (f" (fp32 by {', '.join(by)})" if by else ""),
            "argmax": min(n["argmax_agree"] for n in nums)}


def _top_kernel_text(records: list[dict]) -> str:
    """The costliest Inductor kernel over these compiles and its us in each (a slow compile's
    kernel, in order), with its launch config where it changed between compiles."""
    best: dict[str, float] = {}
    for r in records:
        for k in r.get("kernels") or []:
            if k["kernel"].startswith("triton_"):
                best[k["kernel"]] = max(best.get(k["kernel"], 0.0), k["us"])
    if not best:
        return "-"
    name = max(best, key=best.get)
    per = [next((k for k in r.get("kernels") or [] if k["kernel"] == name), None) for r in records]
    us = " / ".join(f"{k['us']:.0f}" if k else "-" for k in per)
    configs = {json_key(k.get("config")) for k in per if k and k.get("config")}
    note = " (configs differ)" if len(configs) > 1 else ""
    return f"`{name[:48]}`: {us}{note}"


def json_key(value: Any) -> str:
    import json

    return json.dumps(value, sort_keys=True, default=str)


SUMMARY_COLUMNS = [("family", "family", ""), ("label", "case", ""), ("variant_label", "variant", ""),
                   ("compiles", "compiles", ""), ("us", "median us", ".0f"), ("vs_stock", "/ stock", ".3f"),
                   ("vs_stock_fix", "/ stock+fix", ".3f"), ("vs_kda", "/ kda", ".3f"),
                   ("spread_pct", "spread across compiles", ""), ("cold_us", "cold us", ".0f"),
                   ("warm_us", "warm us (median)", ".0f"), ("replay_pct", "replay spread (max)", ""),
                   ("compile_s", "compile s cold / warm", ""), ("caches", "FX cache per compile", ""),
                   ("logits", "logits max abs diff vs fp32 (median row / max row)", ""),
                   ("argmax", "argmax agree (min)", ".3f"), ("rewrites", "rewrites", ""),
                   ("top_kernel", "costliest Inductor kernel: us per compile", "")]


CONSOLE_COLUMNS = [c for c in SUMMARY_COLUMNS if c[0] not in ("family", "vs_stock_fix", "compile_s", "rewrites")]
"""The table a device call prints (its log's tail): the markdown one less a few columns."""


def table_rows(rows: list[dict]) -> list[dict]:
    """Summary rows as the table shows them (percentages, the mode beside the variant)."""
    out = []
    for r in rows:
        shown = dict(r)
        shown["variant_label"] = r["variant"] + (f" [{r['mode']}]" if r.get("mode") not in ("", DEFAULT_MODE) else "")
        shown["spread_pct"] = f"{r['spread']:.1%}" if r.get("spread") is not None else "-"
        shown["replay_pct"] = f"{r['replay_spread']:.1%}" if r.get("replay_spread") is not None else "-"
        if r.get("error") and r.get("us") is None:
            shown["top_kernel"] = f"failed: {r['error'][:120]}"
        out.append(shown)
    return out


DEFAULT_MODE = "fresh"


def run_mode(settings: RunSettings) -> str:
    """The way a record's compiles were made, beside its variant where not the default (a
    fresh process per compile, the first on an empty cache, kda through torch.compile)."""
    parts = [settings.caches] + (["in-process"] if settings.in_process else []) + \
        (["via explain"] if settings.via == "explain" else [])
    return ", ".join(parts)


def section_markdown(section: dict[str, Any], notes: str) -> str:
    """A section of hf_models.md: heading (date, commit, GPU, versions), what the run's
    calls ran and did not start, how to read it, the summary table."""
    from benchmarks import _hf_record

    lines = [_hf_record.heading(section), ""]
    if not section["env"].get("gpu"):
        lines += ["A CPU smoke run (`--smoke`: tiny dims, 2 layers, rewrites forced): the timings mean nothing.", ""]
    if section.get("dirty"):
        lines += [f"The tree differed from commit {section['commit']} ({', '.join(section.get('changed') or [])[:300]}): "
                  "these rows are of uncommitted code.", ""]
    for call in section.get("calls", []):
        ran = ", ".join(f"{k} ({n} compiles)" for k, n in call.get("ran", {}).items()) or "nothing"
        lines.append(f"- call {call['started']} (`{' '.join(call.get('argv', []))}`): ran {ran}"
                     + (f"; not started (budget): {'; '.join(call['not_started'])}" if call.get("not_started") else ""))
    lines += [f"- note: {r}" for r in section.get("remarks", [])]
    lines += ["", notes, "",
              _timing.markdown_table(table_rows(summarize(section["records"])), SUMMARY_COLUMNS).rstrip()]
    return "\n".join(lines) + "\n"


NOTES = ("4 layers (3 linear + 1 full; indexer families 4 indexed), 16 experts, bf16, random weights, the "
         "decoder stack timed (the LM head only for the logits check); default speed rules. Each compile runs "
         "in a fresh process; the first compile of a variant on an empty Inductor cache (cold), the others "
         "reading it (warm: a restarted server); variants alternate. median us: over the compiles of a "
         "variant (each compile's own figure: the median of its CUDA-graph replay rounds); spread across "
         "compiles: (max - min) / median; replay spread: the largest (max - min) / median of one compile's "
         "replay rounds (the noise within a compile); FX cache per compile: H hit, M miss, B bypass; logits: "
         "each row's max |logit - fp32 model's logit| over the vocabulary (median over rows / max), argmax "
         "agreement with the fp32 model (the lowest of the compiles); kda-no-<rewrite>: kda with that "
         "rewrite disabled (its / kda column); stock+fix: stock with the is_exporting fix (only where this "
         "torch folds it). Per-compile kernel tables (top kernels, launch configs, autotune cache outcome) "
         "are in hf_models.json.")


# --------------------------------------------------------------------------- the plan


PLAN_OVERHEAD_S = 25.0
"""Assumed seconds of one compile's process beyond compiling (H200): importing torch and
transformers, building the model on the GPU, the fp32 reference, the step's replays, the profile."""
PLAN_WARM_SHARE = 0.4
"""Assumed warm compile time as a share of the cold one (no warm compile was recorded yet)."""
PLAN_DEFAULT_COLD_S = 30.0
"""Assumed cold compile seconds of a (family, case) with none recorded."""
PLAN_GPU_S = 15.0
"""Assumed seconds a compile's process holds the GPU lock (setup, autotune, replays, profile,
logits) where no ``--jobs`` run recorded it."""
def _assumed_fires() -> dict[tuple[str, str], tuple[str, ...]]:
    """The rewrites assumed to fire (a kda-no-<rewrite> variant each) where no kda compile of the
    (family, case) is recorded, for the plan's estimate only (an over-estimate costs nothing): in
    the GDN / KDA families' decode step every registered rewrite but the indexer's (transformers
    has no paged cache); in their prefill the conv (the speed rule leaves a 4096-token norm to
    Inductor); nothing in the indexer families."""
    from kda_inductor import REWRITE_NAMES

    decode = tuple(n for n in REWRITE_NAMES if not n.startswith("indexer_"))
    return {("linear", "decode"): decode, ("linear", "prefill"): ("causal_conv1d",)}


def _recorded(sections: list[dict]) -> dict[tuple, dict[str, Any]]:
    """The newest recorded cold compile seconds per (family, case) and variant kind (stock,
    kda), from legacy rows and cold compile records, and the rewrites kda's cold compile made
    (records only: the legacy rows' are from older code)."""
    out: dict[tuple, dict[str, Any]] = {}
    label_to_case = {case_label(c, smoke=False): c for c in CASES}
    for s in sections:
        for row in s.get("legacy_rows", []):
            rec = out.setdefault((row.get("family"), label_to_case.get(row.get("case"))), {})
            for kind in ("stock", "kda"):
                v = row.get(f"{kind}_compile_s") or (row.get(f"{STOCK_FIX}_compile_s") if kind == "stock" else None)
                if v:
                    rec[kind] = v
        for r in s.get("records", []):
            if limited_s(r):  # killed at a limit: at least that long
                out.setdefault((r["family"], r["case"]), {}).setdefault("limited", {})[r["variant"]] = limited_s(r)
            if r.get("gpu_s"):
                out.setdefault((r["family"], r["case"]), {}).setdefault("gpu_all", []).append(r["gpu_s"])
            if r.get("cache") == "cold" and r.get("compile_s") and r.get("variant") != "eager":
                rec = out.setdefault((r["family"], r["case"]), {})
                rec["kda" if r["variant"].startswith("kda") else "stock"] = r["compile_s"]
                if r["variant"] == "kda" and r.get("pass_runs"):
                    rec["fired"] = [k for k, v in (r.get("matches") or {}).items() if v]
    for rec in out.values():  # a compile's lock time, and the once-a-run extra of a family's first
        if rec.get("gpu_all"):  # compile (fla-core's eager kernels compiling and autotuning)
            rec["gpu_s"] = statistics.median(rec["gpu_all"])
            rec["first_gpu_s"] = max(rec.pop("gpu_all")) - rec["gpu_s"]
    return out


TABLE_KEY_REWRITE = {"decode": "gdn_recurrent_step", "prefill": "causal_conv1d"}
"""The rewrite that matters most in each kind of case: the table's one kda-no-<rewrite> (recipe
``table``; ``rounds`` plans one per rewrite that fired)."""


def plan_variants(family: Family, case: str, fired: list[str] | None, recipe: str = "rounds") -> list[str]:
    """The variants proposed for a (family, case): eager, stock, stock+fix for prefill only (the
    fix changes what transformers dispatches for the chunked prefill core; decode keeps the
    reference core either way), kda, and kda-no-<rewrite> by name for the rewrites that fired in
    a recorded kda compile, else for every registered rewrite of ``_assumed_fires()`` (by
    name, so that a case can be split across calls; one that does not fire runs as kda); under
    ``recipe`` table only ``TABLE_KEY_REWRITE``'s of those."""
    from kda_inductor.patterns import REWRITE_NAMES

    kind = "prefill" if case.startswith("prefill") else "decode"
    names = fired if fired is not None else _assumed_fires().get((family.kind, kind), ())
    names = [n for n in names if n in REWRITE_NAMES and (recipe != "table" or n == TABLE_KEY_REWRITE[kind])]
    return ["eager", "stock"] + ([STOCK_FIX] if case.startswith("prefill") else []) + ["kda"] + [f"kda-no-{n}" for n in names]


def plan(sections: list[dict], families: list[Family], cases: list[str], compiles: int, call_s: float,
         lanes: int = 1, recipe: str = "rounds", jobs: int = 1,
         variants: list[str] | None = None,
         done: dict[tuple[str, str], set[str]] | None = None,
         only: dict[str, tuple[str, ...]] | None = None) -> tuple[list[dict], list[list[list[str]]]]:
    """Estimated seconds per (family, case) under ``recipe`` (``compiles``), from the recorded
    cold compile times and GPU-lock times (``PLAN_*`` assumptions where none), and a split into
    device calls of ``lanes`` GPUs, each lane at most ``call_s`` seconds (a case longer than that
    split by variant). With ``jobs`` compile processes at once a variant costs the larger of its
    process seconds / ``jobs`` and its GPU seconds (one process at a time holds the GPU): an
    upper bound, since a sum of maxima is at least the maximum of the sums. Returns (rows,
    calls: each a list of lanes, each a list of argument strings run one after the other).
    ``variants`` narrows each case's (``--variant``). A family's first compile in a call holds the
    GPU longer (the largest recorded lock time over the median, added to each case's first
    variant: a case may open a call). ``done``: the variants a (family, case) needs no more
    (:func:`measured_at`); a case with nothing left is not planned. ``only``: a family's cases where it
    names the family (:data:`TABLE_CASES_OF`)."""
    recorded = _recorded(sections)
    rows, out_jobs = [], []
    for fam in families:
        for case in [c for c in cases if c in (only or {}).get(fam.name, cases)]:
            rec = recorded.get((fam.name, case), {})
            stock = rec.get("stock", PLAN_DEFAULT_COLD_S)
            kda = rec.get("kda", stock)
            gpu = rec.get("gpu_s", PLAN_GPU_S)
            per = {}
            names = plan_variants(fam, case, rec.get("fired"), recipe)
            names = [n for n in names if variants is None or n in variants] or names
            names = [n for n in names if n not in (done or {}).get((fam.name, case), ())]
            if not names:
                continue
            for v in names:
                states = _hf_sched.round_states(recipe, compiles, v, "fresh")
                cold = 0.0 if v == "eager" else (kda if v.startswith("kda") else stock)
                cold = rec.get("limited", {}).get(v, cold)
                n_cold, n_warm = states.count("cold"), states.count("warm")
                process_s = len(states) * PLAN_OVERHEAD_S + cold * (n_cold + PLAN_WARM_SHARE * n_warm)
                per[v] = max(process_s / max(jobs, 1), len(states) * gpu) if jobs > 1 else process_s
                if v in rec.get("limited", {}):  # never compiles in time: the call's end kills it at the latest
                    per[v] = min(per[v], call_s)
            per[next(iter(per))] += rec.get("first_gpu_s", 0.0)
            total = sum(per.values())
            rows.append({"family": fam.name, "case": case, "recorded": "stock" in rec, "stock_cold_s": stock,
                         "kda_cold_s": kda, "gpu_s": gpu, "fired_known": "fired" in rec, "total_s": total,
                         "per_variant_s": per})
            out_jobs += _jobs(fam.name, case, per, call_s)
    return rows, _pack(out_jobs, call_s, lanes)


LIMITED_AT_S = 300.0
"""A compile killed after at least this many seconds (by ``--compile-limit``, or by a run's
budget + grace set to be that limit, as ``.ci/table``'s background item for a harness before
``--compile-limit``) did not compile in a time a user waits: measured, as failed. A compile
killed sooner by a call's budget was cut short and is measured again."""


def limited_s(record: dict[str, Any]) -> float | None:
    """The seconds ``record``'s compile ran before a limit killed it (see ``LIMITED_AT_S``), or None."""
    if record.get("compile_limit_s"):
        return float(record["compile_limit_s"])
    found = re.match(r"killed after (\d+) s", str(record.get("error") or ""))
    return float(found.group(1)) if found and float(found.group(1)) >= LIMITED_AT_S else None


def measured_at(sections: list[dict], commit: str, recipe: str, compiles: int) -> dict[tuple[str, str], set[str]]:
    """The variants of each (family, case) that the section of ``commit`` (a prefix) holds every
    compile of under ``recipe`` (a row with a time, or one killed at ``--compile-limit``): what a
    table frozen at that commit needs no more."""
    found = [s for s in sections if s.get("commit", "").startswith(commit) and s.get("records")]
    if not found:
        raise SystemExit(f"--at {commit}: no section of that commit in hf_models.json")
    count: dict[tuple[str, str, str], int] = {}
    for r in (r for s in found for r in s["records"]):
        if r.get("us") is not None or limited_s(r):
            key = (r["family"], r["case"], r["variant"])
            count[key] = count.get(key, 0) + 1
    done: dict[tuple[str, str], set[str]] = {}
    for (family, case, variant), n in count.items():
        if n >= len(_hf_sched.round_states(recipe, compiles, variant, "fresh")):
            done.setdefault((family, case), set()).add(variant)
    return done


def _jobs(family: str, case: str, per: dict[str, float], call_s: float) -> list[tuple[float, str]]:
    """One (family, case) as device jobs of at most ``call_s`` seconds where it can be split
    (by variant, in order)."""
    head = f"--family {family} --case {case}"
    groups: list[list[str]] = [[]]
    for v, cost in per.items():
        if groups[-1] and sum(per[x] for x in groups[-1]) + cost > call_s:
            groups.append([])
        groups[-1].append(v)
    return [(sum(per[v] for v in g), f"{head} --variant {','.join(g)} (~{sum(per[v] for v in g):.0f} s)")
            for g in groups]


def _pack(jobs: list[tuple[float, str]], call_s: float, lanes: int) -> list[list[list[str]]]:
    """First-fit of the jobs into lanes of at most ``call_s`` s, ``lanes`` lanes a call."""
    lane_list: list[tuple[float, list[str]]] = []
    for cost, args in sorted(jobs, key=lambda j: -j[0]):
        for i, (used, members) in enumerate(lane_list):
            if used + cost <= call_s:
                lane_list[i] = (used + cost, members + [args])
                break
        else:
            lane_list.append((cost, [args]))
    lane_args = [members for _, members in lane_list]
    return [lane_args[i:i + lanes] for i in range(0, len(lane_args), lanes)]


def print_plan(rows: list[dict], calls: list[list[list[str]]], jobs: int = 1) -> None:
    for it in rows:
        per = ", ".join(f"{k} {v:.0f}" for k, v in it["per_variant_s"].items())
        print(f"{it['family']:12s} {it['case']:9s} ~{it['total_s']:5.0f} s  (cold compile s: stock "
              f"{it['stock_cold_s']:.0f}, kda {it['kda_cold_s']:.0f}{'' if it['recorded'] else ' (assumed)'}"
              f"{'' if it['fired_known'] else '; rewrites assumed'}: {per})")
    total = sum(it["total_s"] for it in rows)
    print(f"total ~{total:.0f} s of work; {len(calls)} device call(s) of {len(calls[0]) if calls else 0} lane(s); "
          f"assumed: {PLAN_OVERHEAD_S:.0f} s a compile's process beyond compiling, warm compile "
          f"{PLAN_WARM_SHARE:.0%} of cold, {PLAN_DEFAULT_COLD_S:.0f} s cold where none is recorded"
          + (f"; {jobs} compiles at once, {PLAN_GPU_S:.0f} s of GPU lock a compile where none is recorded"
             if jobs > 1 else ""))
    for i, call in enumerate(calls, 1):
        print(f"call {i}:")
        for j, lane in enumerate(call):
            print(f"  lane {j}: " + " ; ".join(lane))


# --------------------------------------------------------------------------- the table's bar


BAR_FAMILIES = 4
"""The table a user reads covers at least this many families, decode and prefill each."""


def check_section(section: dict[str, Any]) -> list[str]:
    """What the newest table still lacks or breaks (empty: it clears the bar): at least
    ``BAR_FAMILIES`` families with both a decode and a prefill case measured for stock and kda,
    stock with more than one compile (a spread), and no case where kda's median is above
    stock's (or stock+fix's). A stock that did not compile within ``--compile-limit`` counts as
    measured where stock+fix did (the case has its baseline; kda compiled)."""
    rows = summarize(section.get("records", []))
    problems = []
    measured: dict[str, set[str]] = {}
    for r in rows:
        if r["variant"] == "kda" and r["us"] is not None:
            other = {x["variant"]: x for x in rows if (x["family"], x["case"]) == (r["family"], r["case"])}
            stock_limited = bool((other.get("stock") or {}).get("limited_s"))
            if stock_limited and STOCK_FIX in other and other[STOCK_FIX]["us"] is not None and r["case"] in TABLE_CASES:
                measured.setdefault(r["family"], set()).add("prefill" if r["case"] == "prefill" else "decode")
            if "stock" in other and other["stock"]["us"] is not None:
                if r["case"] in TABLE_CASES:  # the table's bar: its own cases
                    measured.setdefault(r["family"], set()).add("prefill" if r["case"] == "prefill" else "decode")
                if other["stock"]["spread"] is None:
                    problems.append(f"{r['family']} {r['case']}: stock has one compile (no spread)")
            for base in ("stock", STOCK_FIX):
                if base in other and other[base]["us"] and r["us"] > other[base]["us"]:
                    problems.append(f"{r['family']} {r['case']}: kda {r['us']:.0f} us above {base} "
                                    f"{other[base]['us']:.0f} us")
    full = sorted(f for f, kinds in measured.items() if kinds == {"decode", "prefill"})
    if len(full) < BAR_FAMILIES:
        problems.append(f"{len(full)} families with decode and prefill measured ({', '.join(full) or 'none'}); "
                        f"the table needs {BAR_FAMILIES} (measured at all: {', '.join(sorted(measured)) or 'none'})")
    return problems


def newest_gpu_section(sections: list[dict]) -> dict | None:
    gpu = [s for s in sections if s.get("env", {}).get("gpu") and s.get("records")]
    return max(gpu, key=lambda s: s.get("env", {}).get("date", "")) if gpu else None


# --------------------------------------------------------------------------- main


def _args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--smoke", action="store_true", help="tiny configs on CPU, rewrites forced, each compile checked against eager")
    add("--family", action="append", choices=sorted(BY_NAME), help="only these (repeatable; narrows --stage)")
    add("--case", action="append", choices=list(CASES), help="only these cases (repeatable; default the table's: decode32, decode128, prefill)")
    add("--stage", action="store_true", help=f"the families of `.ci/gpu hf` (the default): {', '.join(STAGE)}")
    add("--variant", default=None, help="comma list: eager, stock, stock+fix, kda, kda-no-<rewrite>, kda-no-* "
                                        "(every rewrite that fired in kda), each also with @no-fla (fla-core "
                                        "hidden) and / or @no-cudnn-sdp; kda@with-<rewrite> (its speed rule "
                                        "bypassed); default all")
    add("--compiles", type=int, default=3, help="compiles per variant (--recipe rounds: the first cold, the others "
                                                "warm; table: stock's cold compiles)")
    add("--recipe", choices=_hf_sched.RECIPES, default="rounds",
        help="rounds: every variant --compiles times; table: stock --compiles cold compiles, kda cold + warm, "
             "kda-no-<the case's key rewrite> cold (TABLE_KEY_REWRITE), eager once (benchmarks/_hf_sched.py)")
    add("--jobs", type=int, default=1, help="compile processes at once (their GPU work one at a time, under a lock)")
    add("--caches", choices=CACHE_MODES, default="fresh", help="see RunSettings")
    add("--in-process", action="store_true", help="compile in this process (dynamo reset between compiles)")
    add("--via", choices=["compile", "explain"], default="compile", help="how kda variants compile")
    add("--budget", type=float, default=None, help="seconds after which no new compile starts")
    add("--grace", type=float, default=150.0, help="seconds a compile started before the budget may run past it")
    add("--compile-limit", type=float, default=None, help="seconds a compile's process may run; one killed at it "
                                                           "is recorded as failed (e.g. a compile a user would not wait for)")
    add("--replay-rounds", type=int, default=3, help="replay rounds per compile (their spread: the replay noise)")
    add("--no-numerics", action="store_true", help="skip the logits check against an fp32 copy")
    add("--no-profile", action="store_true", help="skip the per-compile kernel table")
    add("--all-kernels", action="store_true", help="record every Inductor kernel's launch config per compile")
    add("--results-dir", default=None, help="where hf_models.{json,md} go (default benchmarks/results; "
                                             "--smoke records only here)")
    add("--no-record", action="store_true")
    add("--cache-root", default=None, help="where the per-variant Inductor caches go (default: a temp dir)")
    add("--stamp", action="store_true", help="write .hf_stamp.json (HEAD and its files) for a tree without .git")
    add("--merge", nargs="+", default=None, metavar="JSON", help="merge hf_models.json copies of several calls")
    add("--remark", default=None, help="with --merge and --at COMMIT: a note for that commit's section (a cell left "
        "out and why)")
    add("--plan", action="store_true", help="estimate each (family, case) and propose device calls")
    add("--check", action="store_true", help="the newest GPU section against the table's bar (exit 1 if short)")
    add("--at", default=None, metavar="COMMIT", help="--plan: only what the section of COMMIT (a table frozen "
                                                     "there, .ci/table) does not hold yet")
    add("--call-seconds", type=float, default=480.0, help="--plan: seconds of work per device call and lane")
    add("--lanes", type=int, default=1, help="--plan: GPUs per device call (one lane each)")
    add("--worker", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _families(args) -> list[Family]:
    names = args.family or list(STAGE)
    return [BY_NAME[n] for n in dict.fromkeys(names)]


def _check_variants(requested: list[str] | None) -> None:
    from kda_inductor.options import TRACE_RULES
    from kda_inductor.patterns import REWRITE_NAMES

    for v in map(_hf_sched.base_variant, requested or ()):
        name = v.removeprefix("kda-no-")
        if v not in ("eager", "stock", STOCK_FIX, "kda", "kda-no-*") and not (
                v.startswith("kda-no-") and (name in REWRITE_NAMES or name in TRACE_RULES)):
            raise SystemExit(f"--variant: unknown {v!r} (eager, stock, {STOCK_FIX}, kda, kda-no-*, "
                             f"kda-no-<rewrite> with a rewrite of {list(REWRITE_NAMES)} or a trace rule "
                             f"of {list(TRACE_RULES)})")


def main(argv=None) -> list[dict]:
    from benchmarks import _hf_record

    args = _args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.worker:
        worker_main(args.worker)
        return []
    if args.stamp:
        print(f"wrote {_hf_record.write_stamp()}: carry it to a tree without .git")
        return []
    results = Path(args.results_dir) if args.results_dir else RESULTS
    if args.merge:
        return _merge(args.merge, results, args.remark, args.at)
    cases = args.case or list(TABLE_CASES)
    if args.check:
        section = newest_gpu_section(_hf_record.load_sections(results / "hf_models.json"))
        problems = check_section(section) if section else ["no GPU section recorded"]
        print(f"hf_models --check: section of {section['commit'][:10] if section else '-'}: "
              + ("clears the bar" if not problems else "short of the bar:\n  " + "\n  ".join(problems)))
        if problems:
            raise SystemExit(1)
        return []
    if args.plan:
        sections = _hf_record.load_sections(results / "hf_models.json")
        done = measured_at(sections, args.at, args.recipe, args.compiles) if args.at else None
        print_plan(*plan(sections, _families(args), cases, args.compiles, args.call_seconds, args.lanes, args.recipe,
                         args.jobs, args.variant.split(",") if args.variant else None, done,
                         None if args.case else TABLE_CASES_OF), jobs=args.jobs)
        return []
    return _run(args, cases, results)


def _merge(paths: list[str], results: Path, remark: str | None = None, at: str | None = None) -> list[dict]:
    """The calls' files merged into the results (a section per commit); ``remark``: a note for the
    section of commit ``at`` (what its rows cannot say: a cell left out and why)."""
    from benchmarks import _hf_record

    sections = _hf_record.merge_files([Path(p) for p in paths])
    if remark:
        hits = [s for s in sections if at and str(s.get("commit", "")).startswith(at)]
        if not hits:
            raise SystemExit(f"--remark: no section of commit {at!r} (pass --at COMMIT)")
        for s in hits:
            s["remarks"] = [*(r for r in s.get("remarks", []) if r != remark), remark]
    _hf_record.save_sections(results / "hf_models.json", sections)
    for s in sections:
        if s.get("records"):
            _hf_record.write_markdown(results / "hf_models.md", TITLE, INTRO, s, section_markdown(s, NOTES))
    print(f"merged {len(paths)} files: {len(sections)} sections in {results / 'hf_models.json'}")
    return sections


TITLE = "transformers hybrid models"
INTRO = ("`python -m benchmarks.hf_models` (GPU; `--smoke` on CPU). Each section is one run at one commit, "
         "named in its heading with the date, GPU and versions; a run split over several device calls is one "
         "section only when every call ran the same commit on the same versions. Sections between "
         "`hf-section` markers are rendered from `hf_models.json`; text outside them is kept as written.")


def _settings(args) -> RunSettings:
    import tempfile

    return RunSettings(smoke=args.smoke, device="cpu" if args.smoke else "cuda", compiles=args.compiles,
                       caches=args.caches, in_process=args.in_process, via=args.via,
                       replay_rounds=args.replay_rounds, numerics=not args.no_numerics,
                       profile=not args.no_profile, all_kernels=args.all_kernels, budget=args.budget,
                       grace=args.grace, cache_root=args.cache_root or tempfile.mkdtemp(prefix="hf_caches_"),
                       options={"kda": {"force": True}} if args.smoke else None, recipe=args.recipe,
                       jobs=args.jobs, compile_limit=args.compile_limit)


def _run(args, cases: list[str], results: Path) -> list[dict]:
    """Every (family, case) of the call, its compiles recorded as they finish: the call's
    section (this source state and environment) of hf_models.json / .md is written after each
    compile, so a call cut short keeps what it measured."""
    from benchmarks import _hf_record

    settings = _settings(args)
    if settings.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("hf_models: no CUDA device; use --smoke for the CPU checks")
    requested = args.variant.split(",") if args.variant else None
    _check_variants(requested)
    state = _hf_record.source_state()
    env = {**_timing.environment_info(), **_hf_record.env_versions()}
    call = {"id": _hf_record.call_id(), "started": env["date"], "argv": list(args.argv), "ran": {},
            "not_started": []}
    record_to = None if args.no_record or (args.smoke and not args.results_dir) else results
    sections = _hf_record.load_sections(record_to / "hf_models.json") if record_to else []
    records: list[dict] = []
    mode = run_mode(settings)
    print(f"hf_models: commit {state['commit'][:12]}{' (dirty)' if state['dirty'] else ''}, "
          f"{env.get('gpu') or 'CPU'}, torch {env['torch']}, transformers {env.get('transformers')}, "
          f"fla-core {env.get('fla')}; recipe {settings.recipe} ({settings.compiles}), {settings.jobs} compile "
          f"process(es) at once, caches {mode}", flush=True)

    def sink(record: dict) -> None:
        record.update(source=state["source"], env=env, call=call["id"], mode=mode,
                      label=case_label(record["case"], smoke=settings.smoke))
        records.append(record)
        key = f"{record['family']} {record['case']}"
        call["ran"][key] = call["ran"].get(key, 0) + 1
        if record_to is not None:
            section = _hf_record.merge_into(sections, state, env, call, records)
            _hf_record.save_sections(record_to / "hf_models.json", sections)
            _hf_record.write_markdown(record_to / "hf_models.md", TITLE, INTRO, section,
                                      section_markdown(section, NOTES))

    budget = Budget(args.budget, args.grace)
    todo = []
    for family in _families(args):
        if load(family) is None:
            call["not_started"].append(f"{family.name} (not in this transformers)")
            continue
        todo += [(family.name, case) for case in cases]
    call["not_started"] += run_compiles(settings, todo, requested, budget, sink)
    if record_to is not None and records:
        sink_final = _hf_record.merge_into(sections, state, env, call, records)
        _hf_record.save_sections(record_to / "hf_models.json", sections)
        _hf_record.write_markdown(record_to / "hf_models.md", TITLE, INTRO, sink_final,
                                  section_markdown(sink_final, NOTES))
    print(f"hf_models ({mode}): this call's compiles\n"
          + _timing.markdown_table(table_rows(summarize(records)), CONSOLE_COLUMNS), flush=True)
    print("ran: " + (", ".join(f"{k} ({n} compiles)" for k, n in call["ran"].items()) or "nothing"), flush=True)
    if call["not_started"]:
        print("not started: " + "; ".join(call["not_started"]), flush=True)
    if record_to is not None:
        print(f"recorded in {record_to / 'hf_models.md'}, section of commit {state['commit'][:12]}"
              f"{' (dirty)' if state['dirty'] else ''}", flush=True)
    return records


if __name__ == "__main__":
    main()
