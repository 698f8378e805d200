"""The corpus cases that reach new kernel paths (4-D norms, the merge through the copy into a
padded output, 2-D page caches, the wrap of slot -1, ten gathers), on CUDA against eager, and
CUDA-graph safe under ``mode="reduce-overhead"`` (no cudagraph skip). Skipped without a GPU.

    python -m pytest -q tests/spellings/test_corpus_cuda.py
"""

from __future__ import annotations

import pytest
import torch

from kda_inductor.testing import assert_no_cudagraph_skips, compile_for_test, fresh_compile
from tests.spellings._corpus import all_cases, check_case, on_device

BY_NAME = {case.name: case for case in all_cases()}

ON_CUDA = [
    "bailing_kda_split",
    "qwen_gdn_merge_padded", "bailing_kda_merge_4d", "cpu_gdn_index_copy_into_zeros",
    "hf_kimi_linear_norm_4d", "vllm_kimi_norm_4d_padded", "fla_rms_norm_ref_3d",
    # (trtllm_unravel_scatter is not matched, and stock Inductor cannot lower its scale.view(uint8) on CUDA)
    "sglang_set_k_and_s_2d", "unmasked_negative_slot_wraps", "deepseek_act_quant_ue8m0",
    "sglang_get_k_and_s", "flat_indices_then_view_2d", "xpu_gather_searchsorted_left_clamp", "sglang_write_then_gather",
    "hf_qwen3_next_conv_prefill", "hf_qwen3_next_conv_decode", "hf_cached_prefill_padded", "dao_causal_conv1d_update_ref_2d",
    "hf_qwen3_next_recurrent_decode", "hf_qwen3_next_recurrent_verify4", "hf_qwen3_next_5_17_layer_repeat",
    "fla_naive_recurrent_kda_gqa", "einsum_head_major_cache",
    "hf_padded_decode", "hf_padded_decode_bf16", "falcon_alibi_decode", "interleaved_decode",
]
CUDAGRAPH = ["qwen_gdn_merge_padded", "bailing_kda_merge_4d", "vllm_kimi_norm_4d_padded", "hf_kimi_linear_norm_4d",
             "sglang_set_k_and_s_2d", "flat_indices_then_view_2d", "hf_qwen3_next_conv_decode",
             "hf_qwen3_next_recurrent_decode", "hf_padded_decode_bf16"]


def test_names_exist():
    assert set(ON_CUDA + CUDAGRAPH) <= set(BY_NAME), sorted(set(ON_CUDA + CUDAGRAPH) - set(BY_NAME))


@pytest.mark.cuda
@pytest.mark.parametrize("name", ON_CUDA)
def test_spelling_on_cuda(name):
    check_case(BY_NAME[name], seed=1, device="cuda")


@pytest.mark.cuda
@pytest.mark.parametrize("name", CUDAGRAPH)
def test_spelling_cudagraph_safe(name):
    case = BY_NAME[name]
    fn, args = on_device(case, 2, "cuda")
    for i in case.mutated_args:  # a cache passed as a plain argument would skip cudagraphs
        torch._dynamo.mark_static_address(args[i])
    with torch.no_grad():  # eager first, as a server's warm-up: what a case looks up, it does here, not traced
        fn(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
    with torch.no_grad(), fresh_compile():
        compiled = compile_for_test(fn, mode="reduce-overhead", options={"kda": {"strict": True, "force": True}})

        def run():
            for _ in range(3):
                compiled(*args)

        assert_no_cudagraph_skips(run)
    assert compiled.matches == case.expected
