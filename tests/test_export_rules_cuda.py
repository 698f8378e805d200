"""``kda_inductor.exporting`` on CUDA (skipped without a GPU): ``torch.export`` of transformers'
Qwen3-Next GDN layer (bf16, K = V = 128, a prefill of 300 tokens: four chunks and a partial one)
traces its chunked core as ONE ``kda::gdn_chunk`` with the speed rules on (not forced: on CUDA the
GDN core's rule holds, ``docs/speed-rules.md``), whichever core the layer holds (fla-core's
``chunk_gated_delta_rule`` where installed, else transformers' torch reference); the AOTInductor
package of that export calls the op, its output within bf16 rounding of eager's."""

from __future__ import annotations

import zipfile

import pytest
import torch

import kda_inductor

pytestmark = pytest.mark.cuda  # the kda_inductor pytest plugin skips these without a GPU
pytest.importorskip("transformers")
modeling = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")


def _layer():
    from transformers import Qwen3NextConfig

    from benchmarks import hf_models

    config = hf_models.config_for(hf_models.BY_NAME["qwen3_next"], Qwen3NextConfig, tiny=True)
    config.linear_key_head_dim = config.linear_value_head_dim = 128  # the released head dims
    torch.manual_seed(0)
    return modeling.Qwen3NextGatedDeltaNet(config, 0).to("cuda", torch.bfloat16).eval(), config


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


def test_aotinductor_package_of_a_gdn_prefill_calls_the_op_on_cuda(tmp_path):
    from kda_inductor import KdaOptions
    from kda_inductor.pass_manager import KdaPostGradPass

    layer, config = _layer()
    x = torch.randn(1, 300, config.hidden_size, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        want = layer(x)
        with kda_inductor.exporting(layer):  # the speed rules on
            ep = torch.export.export(layer, (x,))
        assert sum(1 for n in ep.graph.nodes if "kda.gdn_chunk" in str(n.target)) == 1
        pkg = torch._inductor.aoti_compile_and_package(
            ep, package_path=str(tmp_path / "gdn.pt2"),
            inductor_configs={"post_grad_custom_post_pass": KdaPostGradPass(KdaOptions())})
        got = torch._inductor.aoti_load_package(pkg)(x)
        x2 = torch.randn_like(x)  # fresh input: the package is no replay of the traced one
        want2, got2 = layer(x2), torch._inductor.aoti_load_package(pkg)(x2)
    assert _rel(got, want) < 2e-2 and _rel(got2, want2) < 2e-2, (_rel(got, want), _rel(got2, want2))
    with zipfile.ZipFile(pkg) as z:
        wrappers = [n for n in z.namelist() if n.endswith(".wrapper.json")]
        assert wrappers and all(b"kda::gdn_chunk" in z.read(n) for n in wrappers)
