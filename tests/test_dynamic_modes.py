"""Each rewrite under the three ways users make sizes dynamic.

Serving-style code of this file's own (not the references the other tests use), compiled as
a serving loop runs it: steps of T = 2, 7, 64 and 300 tokens, then (the indexer) a second,
larger cache, in these modes:

* ``automatic``: torch.compile's default; the second size seen recompiles with it symbolic;
* ``mark_dynamic``: ``torch._dynamo.mark_dynamic`` on each input's token dim (where it is not 1:
  Dynamo always specializes sizes 0 and 1);
* ``mark_dynamic_cache`` (the indexer): also on the cache's block count (dim 0);
* ``dynamic``: ``torch.compile(dynamic=True)``: every size symbolic, the block size, row width,
  head dim and the norm's D included; the rewrites specialize those (a guard), the counts stay
  symbolic.

Each sweep asserts, per compiled graph, the exact rewrite count, the number of compiles (a
counting backend around ``kda_inductor``) and bytes equal to eager on every step. One sweep
per rewrite and mode (module-scoped), shared by the tests that read it. Matching is
device-independent: on CPU the rewrites are forced; the speed rules' answers for symbolic sizes
are tested at the end (CPU: left to Inductor, saying why; CUDA: every rewrite kept).
"""

from __future__ import annotations

import dataclasses
import re
import types
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F

from kda_inductor import pass_manager
from kda_inductor.backend import kda_inductor
from kda_inductor.patterns.base import Match
from kda_inductor.reference import random_indexer_cache
from kda_inductor.testing import assert_close_to_eager, fresh_compile, quiet_compile

FP8 = torch.float8_e4m3fn
STEPS = (2, 7, 64, 300)
H, D, C = 4, 128, 96  # heads, head dim (the norm's D, the indexer's), conv channels: no T equals one (duck sizing)
BLOCK = 16
CACHES = (37, 53)  # block counts of the first and the second cache (distinct from every other size)
TABLE_WIDTH = 20  # block-table columns: ceil(300 / 16) plus spares, as a serving table's max width


# --------------------------------------------------------------------------- serving code


def gdn_split(mixed_qkv, g, beta, spec_idx, non_spec_idx):
    """Qwen3-Next-style spec / non-spec split of a GDN layer's inputs (six token gathers)."""
    return (mixed_qkv.index_select(0, spec_idx), mixed_qkv.index_select(0, non_spec_idx),
            g.index_select(1, spec_idx), g.index_select(1, non_spec_idx),
            beta.index_select(1, spec_idx), beta.index_select(1, non_spec_idx))


def kda_merge_norm(spec_out, non_spec_out, spec_idx, non_spec_idx, z, weight):
    """Kimi-KDA-style: merge the two halves into ``[1, T, H, D]``, then flash-linear-attention's
    gated RMSNorm (``1 / sqrt``, weight in float32, sigmoid gate) on the 4-D tensor."""
    out = torch.empty(1, z.shape[0], z.shape[1], z.shape[2], dtype=spec_out.dtype, device=z.device)
    out.index_copy_(1, spec_idx, spec_out)
    out.index_copy_(1, non_spec_idx, non_spec_out)
    x = out.float()
    rstd = 1 / torch.sqrt(x.square().mean(dim=-1, keepdim=True) + 1e-5)
    y = x * rstd * weight * torch.sigmoid(z.float().unsqueeze(0))
    return y.to(spec_out.dtype)


def indexer_gather(kv_cache, dst_value, dst_scale, block_table, cu_seq_lens):
    """DeepSeek-V3.2 prefill gather of the indexer's K cache into preallocated buffers (what
    vLLM's ``cp_gather_indexer_k_quant_cache`` does), sync-free."""
    num_blocks, block_size, row = kv_cache.shape
    n, head_dim = dst_value.shape
    tok = torch.arange(n, device=kv_cache.device)
    req = torch.searchsorted(cu_seq_lens, tok, right=True) - 1
    pos = tok - cu_seq_lens[req]
    blk = block_table[req, pos // block_size].unsqueeze(1)
    off = (pos % block_size).unsqueeze(1)
    pages = kv_cache.view(num_blocks, block_size * row)
    scale_bytes = row - head_dim
    values = pages[blk, off * head_dim + torch.arange(head_dim, device=kv_cache.device)]
    scales = pages[blk, block_size * head_dim + off * scale_bytes + torch.arange(scale_bytes, device=kv_cache.device)]
    dst_value.copy_(values.view(FP8))
    dst_scale.copy_(scales.view(torch.float32))


def indexer_write(k, weight, bias, kv_cache, slot_mapping):
    """DeepSeek-V3.2's indexer K write: LayerNorm, ue8m0 fp8 quantization per 128 values, the
    store into the blocked cache (``view[blk, off] = ...``)."""
    k = F.layer_norm(k.float(), (k.shape[-1],), weight, bias, 1e-6).to(k.dtype)
    x = k.float().unflatten(-1, (-1, 128))
    amax = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-4)
    scale = torch.pow(2, torch.ceil(torch.log2(amax / 448.0)))
    q = (x / scale).clamp(-448.0, 448.0).to(FP8).flatten(1)
    num_blocks, block_size, _ = kv_cache.shape
    head_dim = k.shape[-1]
    flat = kv_cache.view(num_blocks, -1)
    values = flat[:, : block_size * head_dim].view(num_blocks, block_size, head_dim)
    scales = flat[:, block_size * head_dim:].view(torch.float32).view(num_blocks, block_size, -1)
    blk, off = slot_mapping // block_size, slot_mapping % block_size
    values[blk, off] = q.view(torch.uint8)
    scales[blk, off] = scale.flatten(1)


CONV_W = torch.nn.Parameter((0.5 * torch.randn(C, 4, generator=torch.Generator().manual_seed(7))).bfloat16(),
                            requires_grad=False)
"""The short conv's weight: a parameter, so its width stays static under dynamic=True (the op
needs K static; Dynamo keeps parameters' sizes static)."""


def conv_cat_cached(q, k, v, state):
    """Qwen3-Next-style: the depthwise causal conv of ``cat(q, k, v)`` continuing a cached state
    (transformers 5.24's prefill on a cache), the state written in place: the cat form's update."""
    x = torch.cat((q, k, v), -1).transpose(1, 2)
    full = torch.cat([state, x], -1)
    state.copy_(full[..., -state.shape[-1]:])
    out = F.conv1d(full, CONV_W.unsqueeze(1), padding=0, groups=C)[..., -q.shape[1]:]
    return F.silu(out).transpose(1, 2)


# --------------------------------------------------------------------------- inputs per step


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _halves(T: int, g: torch.Generator):
    """A random partition of the T tokens: a third spec (at least one), the rest non-spec."""
    perm = torch.randperm(T, generator=g)
    n = max(1, T // 3)
    return perm[:n], perm[n:]


def split_inputs(T: int, seed: int, blocks: int = 0):
    g = _gen(seed)
    spec, non_spec = _halves(T, g)
    return (torch.randn(T, C, generator=g).bfloat16(), torch.randn(1, T, H, generator=g),
            torch.randn(1, T, H, generator=g).bfloat16(), spec.int(), non_spec.int())


def norm_inputs(T: int, seed: int, blocks: int = 0, dim: int = D):
    g = _gen(seed)
    spec, non_spec = _halves(T, g)
    return (torch.randn(1, spec.numel(), H, dim, generator=g).bfloat16(),
            torch.randn(1, non_spec.numel(), H, dim, generator=g).bfloat16(), spec, non_spec,
            torch.randn(T, H, dim, generator=g).bfloat16(), torch.rand(dim, generator=g) + 0.5)


def _seq_lens(T: int) -> list[int]:
    """Three requests (one empty) of T tokens in all."""
    return [T // 2, 0, T - T // 2]


def gather_inputs(T: int, seed: int, blocks: int = CACHES[0], block_size: int = BLOCK):
    g = _gen(seed)
    seqs = _seq_lens(T)
    needed = sum(-(-s // block_size) for s in seqs)
    cache, table, cu, n = random_indexer_cache(seqs, block_size, D, extra_blocks=blocks - needed, generator=g)
    wide = torch.randint(0, blocks, (table.shape[0], TABLE_WIDTH), generator=g, dtype=table.dtype)
    wide[:, : table.shape[1]] = table
    dst_value = torch.randint(0, 256, (n, D), generator=g, dtype=torch.uint8).view(FP8)  # poisoned
    dst_scale = torch.randint(0, 256, (n, 4), generator=g, dtype=torch.uint8).view(torch.float32)
    return cache, dst_value, dst_scale, wide, cu


def conv_inputs(T: int, seed: int, blocks: int = 0):
    g = _gen(seed)
    return tuple(torch.randn(1, T, C // 3, generator=g).bfloat16() for _ in range(3)) + (
        torch.randn(1, C, 4, generator=g).bfloat16(),)


def write_inputs(T: int, seed: int, blocks: int = CACHES[0], block_size: int = BLOCK):
    g = _gen(seed)
    cache = torch.randint(0, 256, (blocks, block_size, D + 4), generator=g, dtype=torch.uint8)  # poisoned
    slots = torch.randperm(blocks * block_size, generator=g)[:T]
    return ((torch.randn(T, D, generator=g) * 3).bfloat16(), torch.rand(D, generator=g) + 0.5,
            torch.randn(D, generator=g) * 0.1, cache, slots)


# --------------------------------------------------------------------------- the sweeps


@dataclasses.dataclass(frozen=True)
class Case:
    name: str  # the rewrite
    fn: Callable
    inputs: Callable  # (T, seed, blocks) -> args
    token_dims: tuple  # (arg index, dim) of each token-count dim, marked by mark_dynamic; the first: T's
    outputs: Callable  # args, result -> what to compare with eager (mutated args too)
    cache: int | None = None  # the arg index of the paged cache (the indexer), else None


CASES = {
    "gdn_spec_split": Case("gdn_spec_split", gdn_split, split_inputs, ((0, 0), (1, 1), (2, 1), (3, 0), (4, 0)),
                           lambda args, out: out),
    "gated_norm_merge": Case("gated_norm_merge", kda_merge_norm, norm_inputs,
                             ((4, 0), (0, 1), (1, 1), (2, 0), (3, 0)), lambda args, out: (out,)),
    "indexer_k_gather": Case("indexer_k_gather", indexer_gather, gather_inputs, ((1, 0), (2, 0)),
                             lambda args, out: (args[1].view(torch.uint8), args[2].view(torch.uint8)), cache=0),
    "indexer_k_write": Case("indexer_k_write", indexer_write, write_inputs, ((0, 0), (4, 0)),
                            lambda args, out: (args[3],), cache=3),
    "causal_conv1d": Case("causal_conv1d", conv_cat_cached, conv_inputs, ((0, 1), (1, 1), (2, 1)),
                          lambda args, out: (out, args[3])),
}
MODES = ("automatic", "mark_dynamic", "mark_dynamic_cache", "dynamic")


def steps(case: Case) -> list[tuple[int, int]]:
    """``(T, cache blocks)`` of each step: the four token counts, then (the indexer) two steps
    with the second cache."""
    first = [(T, CACHES[0]) for T in STEPS]
    return first + ([(64, CACHES[1]), (7, CACHES[1])] if case.cache is not None else [])


class CountingBackend:
    """``kda_inductor`` with ``options``, counting the graphs Dynamo hands it (one per compile)
    and keeping each graph's inputs as Dynamo traced them (``inputs``: name -> example value,
    its sizes symbolic where Dynamo made them so)."""

    def __init__(self, options: dict):
        self.options, self.compiles, self.inputs = options, 0, []

    def __call__(self, gm, example_inputs):
        self.compiles += 1
        self.inputs.append({n.name: n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"})
        return kda_inductor(gm, example_inputs, options=self.options)

    def traced(self, fn: Callable, arg: int, graph: int = -1) -> torch.Tensor:
        """``fn``'s argument ``arg`` as graph ``graph`` traced it."""
        import inspect

        name = list(inspect.signature(fn).parameters)[arg]
        got = self.inputs[graph]
        return got[f"l_{name}_"] if f"l_{name}_" in got else got[f"L_{name}_"]  # Dynamo's names (case by version)


def fresh(fn: Callable) -> Callable:
    """``fn`` with a code object of its own: Dynamo keeps its compiled code and its automatic-
    dynamic memory of seen sizes per code object, so each sweep starts as a first compile."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)


def mark(case: Case, mode: str, args: tuple) -> None:
    dims = list(case.token_dims) + ([(case.cache, 0)] if mode == "mark_dynamic_cache" else [])
    for i, d in dims:
        if args[i].shape[d] > 1:  # Dynamo specializes sizes 0 and 1 (mark_dynamic on them raises)
            torch._dynamo.mark_dynamic(args[i], d)


def _clone(args: tuple) -> tuple:
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)


def _same_bytes(a: tuple, b: tuple) -> bool:
    """Tensors of ``a`` and ``b`` hold the same bytes (poisoned fp8 / float32 buffers hold NaNs)."""
    return all(torch.equal(x.view(torch.uint8), y.view(torch.uint8)) for x, y in zip(a, b) if isinstance(x, torch.Tensor))


@dataclasses.dataclass
class Sweep:
    case: Case
    mode: str
    compiled: Callable
    backend: CountingBackend
    records: list
    pairs: list = dataclasses.field(default_factory=list)  # (T, blocks, compiled outputs, eager outputs)

    @property
    def counts(self) -> list[int]:
        return [r.matches[self.case.name] for r in self.records]

    def run(self, args: tuple) -> Any:
        with pass_manager.observe() as records, quiet_compile():
            try:
                return self.compiled(*args)
            finally:
                self.records.extend(records)


def sweep(case: Case, mode: str, options: dict | None = None) -> Sweep:
    """Compile ``case`` in ``mode`` and run every step, keeping each step's outputs and eager's."""
    backend = CountingBackend(options or {"kda": {"force": True, "strict": True}})
    compiled = torch.compile(fresh(case.fn), backend=backend, dynamic=True if mode == "dynamic" else None)
    s = Sweep(case, mode, compiled, backend, [])
    for seed, (T, blocks) in enumerate(steps(case)):
        args = case.inputs(T, seed, blocks)
        if mode.startswith("mark_dynamic"):
            mark(case, mode, args)
        eager_args = _clone(args)
        expected = case.outputs(eager_args, case.fn(*eager_args))
        s.pairs.append((T, blocks, case.outputs(args, s.run(args)), expected))
    return s


def _params():
    return [pytest.param((name, mode), id=f"{name}-{mode}") for name, case in CASES.items() for mode in MODES
            if case.cache is not None or mode != "mark_dynamic_cache"]


@pytest.fixture(scope="module", params=_params())
def swept(request) -> Sweep:
    name, mode = request.param
    with fresh_compile():
        yield sweep(CASES[name], mode)


# Compiles per mode (the first step is T = 2, whose split halves have one token each: sizes Dynamo
# specializes, so the split and the norm compile again at T = 7 in every mode; the indexer's counts
# at T = 2 are >= 2). After that one graph serves every T; the second cache recompiles only where
# its block count was static (automatic dynamic: once it changes, mark_dynamic of the token dims).
COMPILES = {
    ("gdn_spec_split", "automatic"): 2, ("gdn_spec_split", "mark_dynamic"): 2, ("gdn_spec_split", "dynamic"): 2,
    ("gated_norm_merge", "automatic"): 2, ("gated_norm_merge", "mark_dynamic"): 2, ("gated_norm_merge", "dynamic"): 2,
    ("indexer_k_gather", "automatic"): 3, ("indexer_k_gather", "mark_dynamic"): 2,
    ("indexer_k_gather", "mark_dynamic_cache"): 1, ("indexer_k_gather", "dynamic"): 1,
    ("indexer_k_write", "automatic"): 3, ("indexer_k_write", "mark_dynamic"): 2,
    ("indexer_k_write", "mark_dynamic_cache"): 1, ("indexer_k_write", "dynamic"): 1,
    ("causal_conv1d", "automatic"): 2, ("causal_conv1d", "mark_dynamic"): 1, ("causal_conv1d", "dynamic"): 1,
}


def test_every_graph_keeps_the_rewrite(swept):
    """Each compiled graph holds exactly one match of the rewrite (the split: one launch of
    its six gathers), in every mode, and the mode compiles as often as it must and no more."""
    key = (swept.case.name, swept.mode)
    assert swept.backend.compiles == COMPILES[key], (key, swept.backend.compiles)
    assert swept.counts == [1] * COMPILES[key], (key, swept.counts, [r.misses for r in swept.records])
    assert all(not r.errors for r in swept.records), [r.errors for r in swept.records]
    if swept.case.name == "causal_conv1d":  # the cat form at every size: the op reads q / k / v, no cat
        assert all({row.target for row in r.after_nodes} & {"kda.causal_conv1d_update_cat.default", "aten.cat.default"}
                   == {"kda.causal_conv1d_update_cat.default"} for r in swept.records), key


def test_bytes_equal_eager_at_every_step(swept):
    """Every step's outputs (the gather's buffers, the write's cache) equal eager's byte for byte
    (the norm: the op's product order is the graph's, bit-exact on CPU)."""
    for T, blocks, got, expected in swept.pairs:
        assert_close_to_eager(tuple(got), tuple(expected), exact=True)


def test_the_last_graph_is_symbolic_in_what_varies(swept):
    """What one graph serves: the last graph traced the token count symbolic and (the indexer)
    the cache's block count too (its sizes as Dynamo traced them, before our guards)."""
    case, backend = swept.case, swept.backend
    arg, dim = case.token_dims[0]
    assert isinstance(backend.traced(case.fn, arg).shape[dim], torch.SymInt), backend.inputs[-1]
    if case.cache is not None:
        assert isinstance(backend.traced(case.fn, case.cache).shape[0], torch.SymInt), backend.inputs[-1]


# --------------------------------------------------------------------------- bad ids after the recompile


@pytest.mark.parametrize("rewrite", ["indexer_k_gather", "indexer_k_write"])
def test_bad_ids_after_the_recompile_are_named(rewrite):
    """After the second cache size recompiled with a symbolic block count (automatic dynamic),
    a block id or slot past the cache is refused naming ``block_table`` / ``slot_mapping``,
    and the rejected call leaves the cache and the buffers as they were."""
    case = CASES[rewrite]
    with fresh_compile():
        s = sweep(case, "automatic")
        assert s.counts == [1, 1, 1] and s.backend.compiles == 3
        if rewrite == "indexer_k_gather":
            args, arg, bad = gather_inputs(64, 99, CACHES[1]), "block_table", CACHES[1] + 3
            args[3][2, 0] = bad  # request 2's first block: past the cache
        else:
            args, arg, bad = write_inputs(64, 99, CACHES[1]), "slot_mapping", CACHES[1] * BLOCK + 5
            args[4][3] = bad
        before = _clone(args)
        with pytest.raises(IndexError, match=rf"^{arg}: .*{bad}"):
            s.run(args)
        assert _same_bytes(args, before)
        assert s.backend.compiles == 3  # the same graph refused it: no recompile


# --------------------------------------------------------------------------- specialized sizes recompile


def test_a_specialized_size_recompiles_for_another_value():
    """Under dynamic=True the block size and the head dim are symbolic; the rewrites read
    their example values and add a guard, so another block size (the gather, the write) or head
    dim (the norm) compiles again, rewritten for that value, bytes equal to eager."""
    with fresh_compile():
        s = sweep(CASES["indexer_k_gather"], "dynamic")
        assert s.backend.compiles == 1
        for T, bs in ((64, 32), (300, 32), (7, BLOCK)):
            args = gather_inputs(T, T, CACHES[0], block_size=bs)
            eager = _clone(args)
            indexer_gather(*eager)
            s.run(args)
            assert_close_to_eager((args[1].view(torch.uint8), args[2].view(torch.uint8)),
                                  (eager[1].view(torch.uint8), eager[2].view(torch.uint8)), exact=True)
        assert s.backend.compiles == 2 and s.counts == [1, 1], (s.backend.compiles, s.counts)
    with fresh_compile():
        s = sweep(CASES["indexer_k_write"], "dynamic")
        args = write_inputs(64, 6, CACHES[1], block_size=32)
        eager = _clone(args)
        indexer_write(*eager)
        s.run(args)
        assert _same_bytes(args, eager)
        assert s.backend.compiles == 2 and s.counts == [1, 1], (s.backend.compiles, s.counts)
    with fresh_compile():
        s = sweep(CASES["gated_norm_merge"], "dynamic")
        args = norm_inputs(64, 5, dim=64)
        expected = kda_merge_norm(*_clone(args))
        assert_close_to_eager(s.run(args), expected, exact=True)
        assert s.backend.compiles == 3 and s.counts == [1, 1, 1], (s.backend.compiles, s.counts)


def test_mark_dynamic_on_a_size_the_op_needs_static_is_a_miss():
    """A block size the user marked dynamic cannot be specialized (Dynamo would fail the
    compile): not rewritten, the miss names the marked dim and what to do, the compile works."""
    case = CASES["indexer_k_gather"]
    with fresh_compile():
        backend = CountingBackend({"kda": {"force": True}})
        s = Sweep(case, "mark", torch.compile(fresh(case.fn), backend=backend), backend, [])
        args = gather_inputs(64, 1)
        torch._dynamo.mark_dynamic(args[0], 1)
        eager = _clone(args)
        indexer_gather(*eager)
        s.run(args)
        assert torch.equal(args[1].view(torch.uint8), eager[1].view(torch.uint8))
    assert s.counts == [0]
    misses = s.records[0].misses[case.name]
    assert misses and all("L['kv_cache'].size()[1] is marked dynamic" in m.check and "maybe_mark_dynamic" in m.check
                          for m in misses), misses
    assert all(m.location.endswith(f"test_dynamic_modes.py:{_line(indexer_gather, 'values = pages[')}")
               or m.location.endswith(f"test_dynamic_modes.py:{_line(indexer_gather, 'scales = pages[')}")
               for m in misses), misses


def test_mark_dynamic_on_the_norms_d_is_a_miss():
    """The norm's D marked dynamic (on every input that has it) cannot be specialized: not
    rewritten, and the miss at the norm's line says why (not another reason)."""
    case = CASES["gated_norm_merge"]
    with fresh_compile():
        backend = CountingBackend({"kda": {"force": True}})
        s = Sweep(case, "mark", torch.compile(fresh(case.fn), backend=backend), backend, [])
        args = norm_inputs(64, 2)
        for t in (args[0], args[1], args[4]):
            torch._dynamo.mark_dynamic(t, t.dim() - 1)
        torch._dynamo.mark_dynamic(args[5], 0)
        s.run(args)
    assert s.counts == [0]
    (miss,) = s.records[0].misses[case.name]
    assert re.match(r"the norm's last dim \(L\['\w+'\]\.size\(\)\[\d\]\) is symbolic and cannot be made static "
                    r"\(marked dynamic", miss.check) and "maybe_mark_dynamic" in miss.check, miss
    assert miss.location.endswith(f"test_dynamic_modes.py:{_line(kda_merge_norm, 'rstd = ')}"), miss


def _line(fn, text: str) -> int:
    import inspect

    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


# --------------------------------------------------------------------------- speed rules at symbolic sizes


def test_cpu_leaves_symbolic_counts_to_inductor_and_adds_no_guard():
    """Unforced on CPU, a dynamic=True graph's symbolic counts are left to Inductor, the reason
    at the user's line (the op wins only from a static count), and nothing is specialized: a
    second block size runs the same graph."""
    case = CASES["indexer_k_gather"]
    with fresh_compile():
        s = sweep(case, "dynamic", options={"kda": {}})
        assert s.backend.compiles == 1 and s.counts == [0]
        (miss, *_) = s.records[0].misses[case.name]
        assert "left to Inductor" in miss.check and "symbolic" in miss.check, miss
        s.run(gather_inputs(64, 3, CACHES[1], block_size=32))
        assert s.backend.compiles == 1


@pytest.mark.parametrize("name", list(CASES))
def test_cuda_speed_rules_keep_symbolic_sizes(name, monkeypatch):
    """The speed rules' answer on CUDA for a dynamic=True graph (token, request and block counts
    symbolic): every rewrite kept, with no miss. The matches are told they run on CUDA (the
    rules read ``Match.device``); the ops then run their CPU implementations here, so the bytes
    are checked too. The GPU itself: ``tests/test_dynamic_modes_cuda.py``."""
    monkeypatch.setattr(Match, "device", property(lambda self: "cuda"))
    case = CASES[name]
    with fresh_compile():
        s = sweep(case, "dynamic", options={"kda": {"strict": True}})
    assert s.counts == [1] * len(s.records) and s.counts, (s.counts, [r.misses for r in s.records])
    for T, blocks, got, expected in s.pairs:
        assert_close_to_eager(tuple(got), tuple(expected), exact=True)
