"""GPU check and benchmark of the plugin door (``kda_inductor.vllm_ops``) against vLLM's own
CUDA ops: bytes identical, then CUDA-graph replay medians side by side.

``--reference MODULE`` names a module with vLLM's ``indexer_k_quant_and_cache(k, kv_cache,
slot_mapping, quant_block_size, kv_cache_dtype)`` and ``cp_gather_indexer_k_quant_cache(kv_cache,
dst_k, dst_scale, block_table, cu_seq_lens)``: ``vllm._custom_ops`` of a CUDA vLLM install (the
default), or a build of those two kernels from vLLM's source kept outside this repository
(``--reference-path DIR`` is put on ``sys.path`` first). Nothing of vLLM's is in this repository.

Cases: the write (bf16 k, ue8m0 and plain scales, padding slots, T = 1 ... 16384, block 64 and
16, head_dim 128 and 512) on two copies of one random cache: the whole caches must be equal
byte for byte; the gather (4 / 64 / 256 requests of ~1000 tokens, 1024 x 200, a request of
length 0, block 64 and 16, head_dim 128 and 512) into poisoned destinations: equal bytes.
Results: results/vllm_indexer_ops.md/.json.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

import torch

_HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE)]
from _timing import finish, graph_replay_median_us, measure_copy_bandwidth, progress  # noqa: E402

NAME = "vllm_indexer_ops"
COLUMNS = (("op", "op", ""), ("case", "case", ""), ("identical", "bytes identical", ""),
           ("vllm_us", "vLLM CUDA us", ".2f"), ("kda_us", "kda us", ".2f"), ("floor_us", "floor us", ".2f"),
           ("vllm_over_kda", "vLLM / kda", ".2f"))


def write_cases(quick: bool):
    for hd, bs in ((128, 64), (128, 16), (512, 64)):
        for T in ((1, 2048) if quick else (1, 64, 2048, 16384)):
            for fmt in ("ue8m0", ""):
                if hd == 512 and (T > 2048 or fmt == ""):
                    continue
                yield hd, bs, T, fmt


def gather_cases(quick: bool):
    yield 128, 64, [1000 + 7 * (i % 13) for i in range(4)]
    yield 128, 64, [0] + [980 + (i * 37) % 50 for i in range(63)]
    if not quick:
        yield 128, 64, [1000 - (i * 11) % 40 for i in range(256)]
        yield 128, 64, [200] * 1024
    yield 128, 16, [33, 0, 250, 17]
    yield 512, 64, [300, 129, 64]


def _random_k(T, hd, g):
    """Values across 30 binades (and some near powers of two) so that scales and roundings vary."""
    mag = torch.exp2(torch.randint(-12, 18, (T, 1), generator=g).float())
    k = torch.randn(T, hd, generator=g) * mag
    k[:, :4] = mag * torch.tensor([1.0, -2.0, 0.999, 1.5])
    return k.to(torch.bfloat16).cuda()


def run_write(ref, door, hd, bs, T, fmt, bandwidth, reps):
    from kda_inductor import reference as R

    g = torch.Generator().manual_seed(T * 7 + hd + bs)
    blocks = max(4, -(-2 * T // bs))
    cache = torch.randint(0, 256, (blocks, bs, R.cache_row_bytes(hd)), generator=g, dtype=torch.uint8).cuda()
    k = _random_k(T, hd, g)
    slots = torch.randperm(blocks * bs, generator=g)[:T].cuda()
    if T > 1:
        slots[torch.randperm(T, generator=g)[: max(1, T // 16)].cuda()] = -1
    a, b = cache.clone(), cache.clone()
    ref.indexer_k_quant_and_cache(k, a, slots, 128, fmt)
    door.indexer_k_quant_and_cache(k, b, slots, 128, fmt)
    torch.cuda.synchronize()
    row = {"op": "write", "case": f"T={T} hd={hd} bs={bs} {fmt or 'plain'}", "identical": bool(torch.equal(a, b))}
    if not row["identical"]:
        mism = R.written_cache_mismatch(b, a, slots, hd)
        row["mismatch"] = f"{int((a != b).sum())} bytes differ; {mism or 'within one fp8 step'}"
    row["vllm_us"] = graph_replay_median_us(lambda: ref.indexer_k_quant_and_cache(k, a, slots, 128, fmt),
                                            reps=reps, calls=10)
    row["kda_us"] = graph_replay_median_us(lambda: door.indexer_k_quant_and_cache(k, b, slots, 128, fmt),
                                           reps=reps, calls=10)
    moved = T * hd * 2 + T * 8 + T * R.cache_row_bytes(hd)
    row["floor_us"] = moved / bandwidth * 1e6
    return row


def run_gather(ref, door, hd, bs, seq_lens, bandwidth, reps):
    from kda_inductor import reference as R

    g = torch.Generator().manual_seed(len(seq_lens) + hd + bs)
    kv, table, cu, n = R.random_indexer_cache(seq_lens, block_size=bs, head_dim=hd, generator=g, device="cuda")
    table = table.contiguous()
    sb = R.scale_bytes(hd)
    outs = []
    for fn in (ref, door):
        dk = torch.full((n, hd), 0x5A, dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
        ds = torch.full((n, sb), 0xA5, dtype=torch.uint8, device="cuda")
        fn.cp_gather_indexer_k_quant_cache(kv, dk, ds, table, cu)
        outs.append((dk, ds))
    torch.cuda.synchronize()
    (va, sa), (vb, sbb) = outs
    same = torch.equal(va.view(torch.uint8), vb.view(torch.uint8)) and torch.equal(sa, sbb)
    row = {"op": "gather", "case": f"{len(seq_lens)} req N={n} hd={hd} bs={bs}", "identical": bool(same)}
    row["vllm_us"] = graph_replay_median_us(lambda: ref.cp_gather_indexer_k_quant_cache(kv, va, sa, table, cu),
                                            reps=reps, calls=10)
    row["kda_us"] = graph_replay_median_us(lambda: door.cp_gather_indexer_k_quant_cache(kv, vb, sbb, table, cu),
                                           reps=reps, calls=10)
    row["floor_us"] = 2 * n * (hd + sb) / bandwidth * 1e6
    return row


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reference", default="vllm._custom_ops")
    p.add_argument("--reference-path", default=None)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--no-record", action="store_true")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    if args.reference_path:
        sys.path.insert(0, args.reference_path)
    ref = importlib.import_module(args.reference)
    from kda_inductor import vllm_ops as door

    bandwidth = measure_copy_bandwidth("cuda")
    t0 = time.perf_counter()
    rows = []
    for case in write_cases(args.quick):
        rows.append(run_write(ref, door, *case, bandwidth, args.reps))
        progress(rows[-1])
    for case in gather_cases(args.quick):
        rows.append(run_gather(ref, door, *case, bandwidth, args.reps))
        progress(rows[-1])
    for row in rows:
        row["vllm_over_kda"] = row["vllm_us"] / row["kda_us"]
    from torch._dynamo.utils import counters

    taken = dict(counters[door.COUNTER_KEY])
    if taken.get("write_fallback") or taken.get("gather_fallback"):
        raise SystemExit(f"the door left a benchmark call to vLLM: {taken}")
    notes = (f"CUDA-graph replay medians, 10 calls per graph, per call; copy bandwidth {bandwidth / 1e12:.2f} TB/s; "
             f"reference: {args.reference} (vLLM's CUDA kernels); kda: the plugin door kda_inductor.vllm_ops "
             f"(host checks included)")
    finish(NAME, rows, COLUMNS, notes, smoke=False, record=not args.no_record, results_dir=_HERE / "results",
           started=t0)
    bad = [r for r in rows if not r["identical"]]
    if bad:
        raise SystemExit(f"bytes differ: {[(r['case'], r.get('mismatch')) for r in bad]}")
    return rows


if __name__ == "__main__":
    main()
