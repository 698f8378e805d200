"""GPU benchmark of ``moe_routing``: how fast can a MoE layer's routing prologue be?

transformers' ``grouped_mm`` experts (the default on GPUs outside ``generate()``'s decoding, and what
``benchmarks/hf_models.py``'s steps run) sort the (token, expert) pairs by expert id, count them
per expert (``histc``) for the grouped GEMM's offsets, and invert the permutation to put the rows
back. In kda's Qwen3-Next decode-32 step at 8101af1 (H100, ``hf_models.json``'s kernel table) the
kernel Inductor makes of the sort + count (``triton_per_fused__to_copy_arange_index_put_sort_view``:
one program, ``XBLOCK`` 1) took 61.7 us over 4 layers, and a second kernel with a sort in it
(``..._ge_index_masked_fill_mul_sort_sum_...``) another 32.8, against 225 us for the grouped GEMMs
themselves: up to ~10 % of a 972 us step for 320 integers a layer.

Each formulation below gives the same sorted ids, offsets and (for the stable ones) permutation, all
in torch ops that Inductor compiles (no kernel of ours), timed under CUDA-graph replay, stock Inductor:

- ``transformers``: ``sort`` (unstable), ``histc``, ``cumsum``, the inverse by ``index_put``
  (transformers 5.17's ``grouped_mm_experts_forward``);
- ``stable_sort``: ``sort(stable=True)``, ``searchsorted`` offsets (``moe_grouped_experts``' routing);
- ``one_hot``: each pair's rank from a cumulative count per expert (``one_hot(ids, E).cumsum(0)``:
  O(S x E), a scan Inductor spreads over programs), the permutation scattered from it;
- ``pairwise``: the ``moe_routing`` rewrite's rank (``ranked_sort``: the pairs with a smaller id plus
  those with the same id before, one reduction over S x S comparisons), then transformers' ``histc``.

    python benchmarks/bench_moe_routing.py --budget 120      # S 10 .. 40,960 pairs, E 16 / 64 / 512
    python benchmarks/bench_moe_routing.py --smoke           # CPU: the formulations agree, nothing timed

The answer decides whether a rewrite of the routing is worth building (``docs/speed-rules.md``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE)]
from _timing import finish, graph_replay_median_us, perf_counter_median_us, progress  # noqa: E402

NAME = "moe_routing"
# S: 1 / 32 / 128 / 4096 tokens x 10 first (the 2026-12-07 run), then the sizes between (Kimi Linear's top-8:
# 256 pairs at 32 sequences) that place RANKED_PAIRS' bounds (patterns/moe_grouped_experts.py)
CASES = ([(e, s) for e in (16, 64, 512) for s in (10, 320, 1280, 40960)]
         + [(e, s) for e in (16, 512) for s in (80, 160, 256, 2560, 5120)])
COLUMNS = (("E", "experts", ","), ("S", "pairs", ","), ("transformers_us", "transformers us", ".1f"),
           ("stable_sort_us", "stable sort us", ".1f"), ("one_hot_us", "one-hot us", ".1f"),
           ("pairwise_us", "pairwise us", ".1f"),
           ("best", "fastest", ""))


def transformers_routing(ids: torch.Tensor, experts: int):
    """transformers 5.17: ``(sorted ids, perm, offsets, inverse perm)``."""
    ids_g, perm = torch.sort(ids)
    counts = torch.histc(ids_g.float() if ids.device.type == "cpu" else ids_g.int(), bins=experts, min=0,
                         max=experts - 1)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), device=ids.device)
    return ids_g, perm, torch.cumsum(counts, 0, dtype=torch.int32), inv


def stable_sort_routing(ids: torch.Tensor, experts: int):
    ids_g, perm = torch.sort(ids, stable=True)
    bounds = torch.arange(experts, device=ids.device, dtype=ids_g.dtype)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), device=ids.device)
    return ids_g, perm, torch.searchsorted(ids_g, bounds, right=True, out_int32=True), inv


def one_hot_routing(ids: torch.Tensor, experts: int):
    """A pair's rank: the pairs of lower experts, plus its place among its own expert's pairs."""
    seen = F.one_hot(ids, experts).to(torch.int32).cumsum(0)  # [S, E]: pairs up to here, per expert
    offsets = seen[-1].cumsum(0, dtype=torch.int32)
    rank = (offsets - seen[-1])[ids] + seen.gather(1, ids[:, None]).squeeze(1) - 1  # the inverse perm
    perm = torch.empty_like(ids).index_put_((rank,), torch.arange(ids.numel(), device=ids.device))
    return ids[perm], perm, offsets, rank


def pairwise_routing(ids: torch.Tensor, experts: int):
    """The ``moe_routing`` rewrite's sort (a rank by S x S comparisons), then transformers' count."""
    from kda_inductor.patterns.moe_routing import ranked_sort

    ids_g, perm = ranked_sort(ids)
    counts = torch.histc(ids_g.float() if ids.device.type == "cpu" else ids_g.int(), bins=experts, min=0,
                         max=experts - 1)
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), device=ids.device)
    return ids_g, perm, torch.cumsum(counts, 0, dtype=torch.int32), inv


FORMS = {"transformers": transformers_routing, "stable_sort": stable_sort_routing, "one_hot": one_hot_routing,
         "pairwise": pairwise_routing}


def pair_ids(pairs: int, experts: int, device) -> torch.Tensor:
    """Each token's 10 distinct expert ids (top-k of random scores), flattened: ``[S]`` int64."""
    k = min(10, experts)
    g = torch.Generator(device=device).manual_seed(pairs + experts)
    return torch.rand(-(-pairs // k), experts, generator=g, device=device).topk(k, dim=-1).indices.reshape(-1)[:pairs]


def check(ids: torch.Tensor, experts: int, got: dict) -> None:
    """Every form's sorted ids and offsets equal; the stable forms' permutations equal; each inverse inverts."""
    ref_ids, ref_perm, ref_offs, _ = got["stable_sort"]
    arange = torch.arange(ids.numel(), device=ids.device)
    for name, (ids_g, perm, offs, inv) in got.items():
        ok = torch.equal(ids_g, ref_ids) and torch.equal(offs.to(torch.int32), ref_offs)
        ok = ok and torch.equal(ids[perm], ids_g) and torch.equal(inv[perm], arange)
        if name != "transformers":  # torch.sort's default is not stable: ties may come in another order
            ok = ok and torch.equal(perm, ref_perm)
        if not ok:
            raise SystemExit(f"{name}: routing differs (E={experts}, S={ids.numel()})")


def run(experts: int, pairs: int, *, smoke: bool, reps: int) -> dict:
    device = "cpu" if smoke else "cuda"
    ids = pair_ids(pairs, experts, device)
    torch._dynamo.reset()
    compiled = {name: torch.compile(fn, backend="inductor") for name, fn in FORMS.items()}
    with torch.inference_mode():
        check(ids, experts, {name: fn(ids, experts) for name, fn in compiled.items()})
        timer = ((lambda f: perf_counter_median_us(f, reps)) if smoke
                 else (lambda f: graph_replay_median_us(f, reps=reps, inner=5, calls=5)))
        row = {"E": experts, "S": pairs}
        for name, fn in compiled.items():
            row[f"{name}_us"] = timer(lambda fn=fn: fn(ids, experts))
    row["best"] = min(FORMS, key=lambda name: row[f"{name}_us"])
    return row


def report_row(experts: int, pairs: int, s) -> dict:
    """One case for ``benchmarks/report.py`` (``s``: its ``Settings``): stock is transformers' sort + count,
    kda the ``moe_routing`` rewrite's rank + the same count (what the forced rewrite leaves), both compiled
    by Inductor."""
    row = run(experts, pairs, smoke=s.smoke, reps=s.reps)
    return {"rewrite": NAME, "shape": f"E={experts} S={pairs}", "T": pairs, "stock_us": row["transformers_us"],
            "kda_us": row["pairwise_us"]}


def report_jobs(s) -> list:
    """The report's rows: 320 and 1,280 pairs (32 / 128 tokens x top-10) with 16 and 512 experts."""
    if s.smoke:
        return [lambda: report_row(8, 40, s)]
    return [lambda e=e, n=n: report_row(e, n, s) for e, n in ((16, 320), (512, 320), (16, 1280), (512, 1280))]


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget", type=float, default=120, help="seconds; the cases after it are skipped")
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--no-record", action="store_true")
    p.add_argument("--smoke", action="store_true", help="tiny CPU run: checks only")
    args = p.parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (use --smoke on CPU)")
    cases = [(8, 6), (8, 40), (16, 320)] if args.smoke else CASES
    reps = args.reps or (2 if args.smoke else 50)
    t0, rows = time.perf_counter(), []
    for experts, pairs in cases:
        if time.perf_counter() - t0 > args.budget:
            print(f"E={experts} S={pairs}: skipped, --budget spent", flush=True)
            continue
        rows.append(run(experts, pairs, smoke=args.smoke, reps=reps))
        progress(rows[-1])
    notes = ("NOT meaningful (CPU smoke run)" if args.smoke else
             "CUDA-graph replay medians, 5 calls per graph, per call; stock Inductor of each formulation")
    finish(NAME, rows, COLUMNS, notes, smoke=args.smoke, record=not args.no_record,
           results_dir=_HERE / "results", started=t0)
    return rows


if __name__ == "__main__":
    main()
