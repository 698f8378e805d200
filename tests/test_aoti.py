"""Deployment paths: ``torch.export`` -> AOTInductor with our pass keeps every
rewrite on the examples, and export with dynamic token counts works.

AOTInductor compiles C++ here (CPU): one package per test (~30-60 s on two shared cores).
Our pass goes in through ``inductor_configs={"post_grad_custom_post_pass": KdaPostGradPass(...)}``
(one ``CustomGraphPass`` object: what the key takes on torch 2.9-2.14; lists only from 2.13).
``force=True``: on CPU the speed rules would leave the code to Inductor.

Findings these tests pin down:

* AOTInductor lifts a module buffer (the indexer cache) to a constant: the post-grad graph
  reads and ``copy_``s into a ``get_attr`` node, not a placeholder; ``indexer_k_write`` (and
  ``indexer_k_gather_out``'s destinations) accept that root too, and Inductor re-inplaces the
  op on the constant as it does on an input.
* ``Guard failed: block_table.size()[1] == 1``: ``torch.export`` specializes dims whose sample
  size is 0 or 1 (a decode-like sample: every request within one block); it happens in export,
  before any compile, so it is not the rewrite. Export from samples without size-1 dims, or
  under ``torch.fx.experimental._config.backed_size_oblivious = True``.
* The int ``num_tokens`` of the indexer block is static unless exported with ``Dim.DYNAMIC``
  (else ``Guard failed: num_tokens == N``); AOTInductor takes tensor inputs only, so there
  the int stays static (make N a tensor's size to vary it).
"""

from __future__ import annotations

import contextlib
import inspect
import shutil

import pytest
import torch
from torch.export import Dim

from kda_inductor import pass_manager
from kda_inductor.options import KdaOptions
from kda_inductor.patterns.base import proxy_executor_reads_dtypes
from kda_inductor.pass_manager import KdaPostGradPass
from kda_inductor.reference import written_cache_mismatch
from kda_inductor.testing import assert_close_in_range, fresh_compile

import gdn_layers as G  # noqa: E402
import indexer_block as ib  # noqa: E402

needs_aoti = pytest.mark.skipif(
    not hasattr(torch._inductor, "aoti_compile_and_package") or shutil.which("g++") is None,
    reason="needs torch._inductor.aoti_compile_and_package and a C++ compiler",
)
SEQS = [23, 0, 9, 40]  # tiny indexer batch: table width 3, 72 tokens + 3 padding


def _counts(**nonzero: int) -> dict[str, int]:
    """A record's exact matches: these counts, every other registered rewrite 0."""
    from kda_inductor.patterns import REWRITE_NAMES

    return {name: nonzero.get(name, 0) for name in REWRITE_NAMES}


def _size_oblivious():
    """Export without 0/1 specialization where this torch has the switch."""
    try:
        import torch.fx.experimental._config as fx_config
    except ImportError:  # pragma: no cover
        return contextlib.nullcontext()
    if not hasattr(fx_config, "backed_size_oblivious"):  # pragma: no cover
        return contextlib.nullcontext()
    return fx_config.patch(backed_size_oblivious=True)


def _aoti(ep, tmp_path):
    """AOTInductor package of ``ep`` with our pass (forced, strict); (loaded model, records)."""
    configs = {"post_grad_custom_post_pass": KdaPostGradPass(KdaOptions(force=True, strict=True))}
    with fresh_compile(), pass_manager.observe() as records:
        pkg = torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp_path / "model.pt2"),
                                                       inductor_configs=configs)
    return torch._inductor.aoti_load_package(pkg), records


def _can_manage(loaded) -> bool:
    load = getattr(loaded, "load_constants", None)
    return load is not None and "user_managed" in inspect.signature(load).parameters


def _user_managed_cache(loaded, cache: torch.Tensor) -> bool:
    """Hand the package our own cache tensor (so we can read what it writes), if this torch can."""
    if not _can_manage(loaded) or "kv_cache" not in loaded.get_constant_fqns():
        return False
    loaded.load_constants({"kv_cache": cache}, check_full_update=False, user_managed=True)
    return True


def _check_indexer_outputs(got, ref, n):
    idx, logits = got
    ridx, rlogits = ref
    assert torch.equal(torch.isinf(logits[:n]), torch.isinf(rlogits[:n]))  # the same visibility mask
    rows, _ = ib.topk_agreement(ridx[:n], idx[:n], rlogits[:n].float())  # raises on a non-tie swap
    assert rows <= n // 4, rows
    fin = torch.isfinite(rlogits[:n])
    assert_close_in_range([logits[:n][fin].float()], [rlogits[:n][fin].float()])


# --------------------------------------------------------------------------- AOTInductor


@needs_aoti
def test_aoti_indexer_block_keeps_write_and_gather(tmp_path):
    """The cache a module buffer: export lifts it, AOTInductor makes it a constant; both
    indexer rewrites fire (and the gather of 1-byte rows is not taken for a GDN split)."""
    block = ib.make_block(ib.TINY)
    *inputs, n = ib.make_inputs(ib.TINY, SEQS, num_padding=3)
    with torch.no_grad():
        ep = torch.export.export(block, (*inputs, n))
        loaded, records = _aoti(ep, tmp_path)
        assert [r.matches for r in records] == [_counts(indexer_k_write=1, indexer_k_gather=1)]
        assert "get_attr[target=kv_cache]" in records[0].before  # the lifted buffer
        after = records[0].after
        assert "kda.indexer_k_write.default" in after and "kda.indexer_k_gather.default" in after
        cache0 = block.kv_cache.clone()
        for seed in (0, 1):  # new tokens, slots and table each step, same shapes
            *step, n = ib.make_inputs(ib.TINY, SEQS, num_padding=3, seed=seed)
            mine = cache0.clone()
            managed = _user_managed_cache(loaded, mine)
            got = loaded(*step, n)
            block.kv_cache.copy_(cache0)
            ref = block(*step, n)
            _check_indexer_outputs(got, ref, n)
            assert managed or not _can_manage(loaded)
            if managed:  # the package wrote our tensor in place, as eager wrote the buffer
                why = written_cache_mismatch(mine, block.kv_cache, step[2], ib.TINY.head_dim)
                assert why is None, why


def _gdn_args(layer, spec_reqs, decode_reqs, seed):
    hidden, batch, states = G.make_inputs(layer, spec_reqs, decode_reqs, seed=seed)
    return (hidden, batch.spec_idx, batch.non_spec_idx, *states)


@needs_aoti
@pytest.mark.parametrize("cls, cfg", [(G.Qwen3NextGDN, G.GDNConfig.tiny()), (G.KimiKDA, G.KDAConfig.tiny())],
                         ids=["gdn", "kda"])
def test_aoti_gdn_layers_dynamic_tokens_keep_split_and_merge(tmp_path, cls, cfg):
    """Qwen3-Next GDN / Kimi KDA step exported with dynamic token and request counts; one
    package serves batches of other sizes (a single decode request included)."""
    torch.manual_seed(0)
    layer = cls(cfg).eval()
    args = _gdn_args(layer, 3, 4, seed=0)
    auto = Dim.AUTO
    dynamic = tuple({d: auto for d in range(a.dim())} if i < 3 else {0: auto} for i, a in enumerate(args))
    with torch.no_grad():
        with _size_oblivious():
            ep = torch.export.export(layer, args, dynamic_shapes=dynamic)
        assert ep.range_constraints, "nothing dynamic was exported"
        loaded, records = _aoti(ep, tmp_path)
        # the recurrence of each set (spec: draft windows; non-spec: one token) is gdn_recurrent_step's
        want = _counts(gdn_spec_split=1, gated_norm_merge=1, gdn_recurrent_step=2)
        if not proxy_executor_reads_dtypes():  # torch 2.11: a call with a dtype argument stays out of packages
            assert any("dtype argument" in str(m) for m in records[0].misses["gated_norm_merge"])  # always one
            for name in ("gated_norm_merge", "gdn_recurrent_step"):
                if any("dtype argument" in str(m) for m in records[0].misses.get(name, [])):
                    want[name] = 0
        assert [r.matches for r in records] == [want]
        for spec_reqs, decode_reqs in ((3, 4), (2, 7), (5, 1)):
            step = _gdn_args(layer, spec_reqs, decode_reqs, seed=spec_reqs)
            assert_close_in_range(loaded(*step), layer(*step))


class _GatedNorm(torch.nn.Module):
    """A gated RMSNorm alone: ``gated_norm_merge``'s norm-only form (no sources to merge, an
    empty ``indices`` list in the op's call)."""

    def forward(self, x, z, w):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
        return (y * torch.nn.functional.silu(z.float())).to(x.dtype)


@needs_aoti
def test_aoti_leaves_an_op_call_with_an_empty_tensor_list_to_inductor(tmp_path):
    """AOTInductor's proxy executor gives a custom op None for an empty ``Tensor[]`` argument (the
    package's call fails): in a package the norm alone (``indices=[]``) is a miss saying so at the
    user's line, not a failure (``strict``), and the package equals eager; a compile keeps the op."""
    from kda_inductor.testing import compile_for_test, op_counts

    x, z = torch.randn(8, 128, dtype=torch.bfloat16), torch.randn(8, 128, dtype=torch.bfloat16)
    w = torch.randn(128)
    with torch.no_grad():
        loaded, records = _aoti(torch.export.export(_GatedNorm(), (x, z, w)), tmp_path)
        assert [r.matches for r in records] == [_counts()]
        (miss,) = records[0].misses["gated_norm_merge"]
        assert "AOTInductor cannot pass kda::gated_norm_merge's empty Tensor[] 'indices'" in str(miss)
        assert "test_aoti.py" in str(miss)  # at the user's line
        x2, z2 = torch.randn_like(x), torch.randn_like(z)
        assert torch.equal(loaded(x2, z2, w), _GatedNorm()(x2, z2, w))
        compiled = compile_for_test(_GatedNorm())
        compiled(x, z, w)
    assert op_counts(compiled).after[torch.ops.kda.gated_norm_merge.default] == 1


# --------------------------------------------------------------------------- export, dynamic


INDEXER_DYNAMIC = tuple([{0: Dim.AUTO}] * 3 + [{0: Dim.AUTO, 1: Dim.AUTO}, {0: Dim.AUTO}, {0: Dim.AUTO},
                         Dim.DYNAMIC])
"""x, positions, slot_mapping, block_table, cu_seq_lens, req_of_token: every dim; num_tokens too."""


def test_export_from_a_one_block_sample_specializes_the_table_width():
    """Where ``Guard failed: block_table.size()[1] == 1`` comes from: ``torch.export`` itself
    (no compile, no rewrite) specializes a dim whose sample size is 1; without that
    specialization the exported module runs any width."""
    block = ib.make_block(ib.TINY)
    *sample, n = ib.make_inputs(ib.TINY, [5, 3, 7], num_padding=2)  # every request within one block
    assert sample[3].shape[1] == 1
    *wide, n2 = ib.make_inputs(ib.TINY, SEQS, num_padding=3)
    with torch.no_grad():
        ep = torch.export.export(block, (*sample, n), dynamic_shapes=INDEXER_DYNAMIC)
        with pytest.raises(Exception, match=r"block_table.size\(\)\[1\] == 1"):
            ep.module()(*wide, n2)
        with _size_oblivious():
            ep = torch.export.export(block, (*sample, n), dynamic_shapes=INDEXER_DYNAMIC)
        ep.module()(*wide, n2)


def test_export_dynamic_token_counts_then_compile_indexer_block():
    """Exported with dynamic token counts (and table width, requests, num_tokens), then
    ``torch.compile(ep.module(), backend="kda_inductor", dynamic=True)``: one graph with both
    rewrites serves batches of other sizes, each matching eager."""
    block = ib.make_block(ib.TINY)
    *sample, n = ib.make_inputs(ib.TINY, SEQS, num_padding=3)
    with torch.no_grad():
        ep = torch.export.export(block, (*sample, n), dynamic_shapes=INDEXER_DYNAMIC)
        module = ep.module()
        cache0 = module.kv_cache.clone()
        with fresh_compile(), pass_manager.observe() as records:
            compiled = torch.compile(module, backend="kda_inductor", dynamic=True,
                                     options={"kda": {"force": True, "strict": True}})
            for seqs in (SEQS, [30, 12, 2, 50, 17], [40, 17]):  # widths 3, 4, 3; N 72, 111, 57
                *step, n = ib.make_inputs(ib.TINY, seqs, num_padding=2, seed=len(seqs))
                module.kv_cache.copy_(cache0)
                got = compiled(*step, n)
                written = module.kv_cache.clone()
                block.kv_cache.copy_(cache0)
                ref = block(*step, n)
                _check_indexer_outputs(got, ref, n)
                why = written_cache_mismatch(written, block.kv_cache, step[2], ib.TINY.head_dim)
                assert why is None, why
    assert [r.matches for r in records] == [_counts(indexer_k_write=1, indexer_k_gather=1)]


@pytest.mark.parametrize("reads_dtypes", [True, False])
def test_a_dtype_argument_is_refused_where_the_proxy_executor_misreads_it(monkeypatch, reads_dtypes):
    """``aot_refusal``: under AOT compilation a call of our op with a ``torch.dtype`` argument is refused on a
    torch whose proxy executor shifts dtypes (torch 2.11: float32 reached the op as float64; pytorch#173562),
    kept where it reads them; the same call with ``out_dtype=None`` is kept on both; a compile keeps it."""
    import torch.fx as fx

    import kda_inductor.lowerings.gdn_chunk  # noqa: F401  (registers the op)
    from kda_inductor.patterns import base
    from torch._inductor.virtualized import V

    monkeypatch.setattr(base, "proxy_executor_reads_dtypes", lambda: reads_dtypes)

    def graph(out_dtype):
        g = fx.Graph()
        q, k, v, gate, beta = (g.placeholder(n) for n in ("q", "k", "v", "g", "beta"))
        g.output(g.call_function(torch.ops.kda.gdn_chunk.default, (q, k, v, gate, beta), {"out_dtype": out_dtype}))
        return fx.GraphModule(torch.nn.Module(), g)

    assert base.aot_refusal(graph(torch.float32)) is None  # not under AOT compilation
    with V.set_aot_compilation(True):
        why = base.aot_refusal(graph(torch.float32))
        assert (why is None) == reads_dtypes
        assert reads_dtypes or "kda::gdn_chunk's dtype argument 'out_dtype'" in why
        assert base.aot_refusal(graph(None)) is None

