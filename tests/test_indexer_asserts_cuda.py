"""indexer_k_gather / indexer_k_write on CUDA: every refused index is a device-side assert
(each in its own subprocess: an assert poisons the CUDA context); valid calls on the same
odd inputs are bit-exact against the CPU op; a call rejected on the host leaves the cache
and the destinations untouched. Skipped without a GPU.

The subprocesses run 8 at once (one CUDA context each), so the whole file costs a few subprocess
starts plus the kernels' compile, not one per case; one that finds no GPU memory for its context
runs again alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.cuda  # the kda_inductor pytest plugin skips these without a GPU

ROOT = Path(__file__).resolve().parents[1]
GATHER_REFUSED = ["block_id_high", "block_id_low", "column_past_width", "past_cu_end", "past_cu_end_spare_row",
                  "cu0_positive", "cu_decreasing"]
WRITE_REFUSED = ["past_end", "past_end_wrap", "below_minus_num_slots", "past_end_2d"]


def _gather_case(kind: str, how: str) -> str:
    """``how``: the launcher with one grid ("token"/"block"), or the ops ("op", "op_out")."""
    call = {
        "op": "torch.ops.kda.indexer_k_gather(kv, bt, cu, n, hd)",
        "op_out": "torch.ops.kda.indexer_k_gather_out(kv, dv, ds, bt, cu)",
    }.get(how, f"m.gather_triton(kv, bt, cu, dv, ds, grid_by={how!r})")
    return f"""
        import torch
        import kda_inductor.lowerings.indexer_k_gather as m
        from tests.test_lowering_indexer_k_gather import _refused_case
        (kv, bt, cu, n, hd), _, text, _ = _refused_case({kind!r}, "cuda")
        dv = torch.empty(n, hd, dtype=torch.uint8, device="cuda")
        ds = torch.empty(n, hd // 32, dtype=torch.uint8, device="cuda")
        print("EXPECT", text, flush=True)
        {call}
        torch.cuda.synchronize()
        print("NO ASSERT")
    """


def _write_case(kind: str) -> str:
    return f"""
        import torch
        import kda_inductor.lowerings.indexer_k_write  # registers the op
        from tests.test_lowering_indexer_k_write import _wrap_case
        k, cache, slots, total = _wrap_case(seed=7)
        kind = {kind!r}
        wrap = kind != "past_end" and kind != "past_end_2d"
        slots[2] = -total - 1 if kind == "below_minus_num_slots" else total
        cache, k, slots = cache.cuda(), k.cuda(), slots.cuda()
        bs = 0
        if kind == "past_end_2d":
            cache, bs = cache.view(cache.shape[0], -1), cache.shape[1]
        print("EXPECT indexer_k_write: slot", flush=True)
        torch.ops.kda.indexer_k_write(cache, k, slots, None, None, 1e-6, True, True, bs, wrap)
        torch.cuda.synchronize()
        print("NO ASSERT")
    """


CASES = {f"gather-{kind}-{how}": _gather_case(kind, how) for kind in GATHER_REFUSED for how in ("token", "block")}
CASES.update({f"gather-block_id_high-{how}": _gather_case("block_id_high", how) for how in ("op", "op_out")})
CASES.update({f"gather-cu_decreasing-{how}": _gather_case("cu_decreasing", how) for how in ("op", "op_out")})
CASES.update({f"write-{kind}": _write_case(kind) for kind in WRITE_REFUSED})


def _run(code: str, env: dict) -> tuple[int, str, str]:
    try:
        p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=480)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        return -9, e.stdout or "", (e.stderr or "") + "\n(timed out after 480 s)"


def _out_of_memory(result: tuple[int, str, str]) -> bool:
    """A case that died before its call because the GPU had no room for one more context (on an H100,
    2026-12-07, beside the hybrid-model tests of another worker: 11 of 21 cases)."""
    _, so, se = result
    return "EXPECT" not in so and "out of memory" in se


@pytest.fixture(scope="module")
def results():
    """Every case's subprocess, at most 8 at once; a case whose start ran out of GPU memory runs again
    alone after the others. name -> (returncode, stdout, stderr)."""
    from concurrent.futures import ThreadPoolExecutor

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    with ThreadPoolExecutor(max_workers=8) as pool:
        out = dict(zip(CASES, pool.map(lambda code: _run(code, env), CASES.values())))
    for name in [n for n, r in out.items() if _out_of_memory(r)]:
        out[name] = _run(CASES[name], env)
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_refused_index_is_a_device_assert(name, results):
    rc, so, se = results[name]
    assert "EXPECT" in so, f"the case did not get to its call:\n{so}\n{se[-3000:]}"
    assert rc != 0 and "NO ASSERT" not in so, so + se[-3000:]
    expected = so.split("EXPECT", 1)[1].splitlines()[0].strip()
    # the kernel's own message (printed by the assert) or CUDA's report of it
    assert expected in se or "device-side assert" in se, se[-3000:]
    assert "device-side assert" in se or "Assertion" in se, se[-3000:]


# ---------------------------------------------------------------------------------------
# valid calls on the same odd inputs: bit-exact against the CPU op, both grids
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["negative_block_ids", "minus_one", "garbage_in_unused_entries", "cu0_negative",
                                  "fewer_tokens"])
def test_valid_odd_inputs_bit_exact(kind):
    from kda_inductor.lowerings import indexer_k_gather as m
    from tests.test_lowering_indexer_k_gather import _edge_case

    kv, bt, cu, n, hd, _ = _edge_case(kind, device="cpu")
    rv, rs = torch.ops.kda.indexer_k_gather(kv, bt, cu, n, hd)
    gv, gs = torch.ops.kda.indexer_k_gather(kv.cuda(), bt.cuda(), cu.cuda(), n, hd)
    assert torch.equal(gv.cpu(), rv) and torch.equal(gs.cpu(), rs)
    for grid_by in ("token", "block"):
        dv = torch.full((n, hd), 0xAB, dtype=torch.uint8, device="cuda")
        ds = torch.full((n, hd // 32), 0xAB, dtype=torch.uint8, device="cuda")
        m.gather_triton(kv.cuda(), bt.cuda(), cu.cuda(), dv, ds, grid_by=grid_by)
        assert torch.equal(dv.cpu(), rv) and torch.equal(ds.cpu(), rs), grid_by
    pages = kv.reshape(kv.shape[0], -1).cuda()  # the same as a 2-D page cache
    pv, ps = torch.ops.kda.indexer_k_gather(pages, bt.cuda(), cu.cuda(), n, hd, kv.shape[1])
    assert torch.equal(pv.cpu(), rv) and torch.equal(ps.cpu(), rs)


@pytest.mark.parametrize("wrap", [False, True])
@pytest.mark.parametrize("pages", [False, True], ids=["3d", "2d"])
def test_write_negative_slots_bit_exact(wrap, pages):
    from tests.test_lowering_indexer_k_write import _wrap_case

    k, cache, slots, _ = _wrap_case(seed=6)
    bs = cache.shape[1] if pages else 0
    cpu = cache.view(cache.shape[0], -1).clone() if pages else cache.clone()
    torch.ops.kda.indexer_k_write(cpu, k, slots, None, None, 1e-6, True, True, bs, wrap)
    gpu = cpu.new_empty(cpu.shape).copy_(cache.view(cpu.shape)).cuda()
    torch.ops.kda.indexer_k_write(gpu, k.cuda(), slots.cuda(), None, None, 1e-6, True, True, bs, wrap)
    assert torch.equal(gpu.cpu(), cpu)


# ---------------------------------------------------------------------------------------
# rejected on the host: nothing written
# ---------------------------------------------------------------------------------------
def test_host_rejected_calls_leave_cache_and_destinations_untouched():
    from tests.test_lowering_indexer_k_gather import make_case
    from tests.test_lowering_indexer_k_write import _wrap_case

    kv, bt, cu, n, hd, _ = make_case(4, device="cuda")
    dv = torch.randint(0, 256, (n, hd), dtype=torch.uint8, device="cuda")
    ds = torch.randint(0, 256, (n, 4), dtype=torch.uint8, device="cuda")
    dv0, ds0 = dv.clone(), ds.clone()
    for args, match in [
        ((kv, dv, ds, bt.float(), cu), "block_table"),
        ((kv, dv, ds[:, :2], bt, cu), "dst_scale"),
        ((kv, dv, ds, bt, cu.cpu()), "cu_seq_lens"),
        ((kv.view(kv.shape[0], -1), dv, ds, bt, cu), "block_size"),  # 2-D cache without block_size
    ]:
        with pytest.raises((ValueError, TypeError), match=match):
            torch.ops.kda.indexer_k_gather_out(*args)
    torch.cuda.synchronize()
    assert torch.equal(dv, dv0) and torch.equal(ds, ds0)

    k, cache, slots, _ = _wrap_case(seed=8)
    cache, k, slots = cache.cuda(), k.cuda(), slots.cuda()
    before = cache.clone()
    for args, match in [
        ((cache, k[:, :100], slots), "k"),
        ((cache, k, slots[:-1]), "slot_mapping"),
        ((cache, k, slots.float()), "slot_mapping"),
        ((cache, k, slots.cpu()), "slot_mapping"),
        ((cache.view(cache.shape[0], -1), k, slots), "block_size"),
    ]:
        with pytest.raises((ValueError, TypeError), match=match):
            torch.ops.kda.indexer_k_write(*args, None, None, 1e-6, True)
    with pytest.raises(ValueError, match="block_size"):
        torch.ops.kda.indexer_k_write(cache, k, slots, None, None, 1e-6, True, True, 7)
    torch.cuda.synchronize()
    assert torch.equal(cache, before)
