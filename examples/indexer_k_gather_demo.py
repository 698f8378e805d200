"""Demo: compile DeepSeek-V3.2's indexer K-cache gather with backend="kda_inductor".

    python examples/indexer_k_gather_demo.py            # tiny on CPU, the seed workload on a GPU
    python examples/indexer_k_gather_demo.py --small    # tiny everywhere

Prints what the backend did (rewrite matches, the post-grad graph before and after
our pass), checks the compiled gather byte for byte against the eager per-request
loop, and on a GPU times eager / stock torch.compile / kda_inductor by CUDA-graph
replay (benchmarks/bench_indexer_k_gather.py is the full benchmark). Then compiles the
DeepSeek-V3.2-style indexer block of ``examples/indexer_block.py`` (K write + gather in one
model) and reports both rewrites.
"""

from __future__ import annotations

import argparse
import statistics

import torch

import kda_inductor
from kda_inductor.reference import gather_indexer_k, gather_indexer_k_loop, random_indexer_cache


class IndexerKGather(torch.nn.Module):
    """The prefill gather as serving code writes it: the paged cache is a buffer."""

    def __init__(self, kv_cache: torch.Tensor, num_tokens: int):
        super().__init__()
        self.register_buffer("kv_cache", kv_cache)
        self.num_tokens = num_tokens

    def forward(self, block_table, cu_seq_lens):
        return gather_indexer_k(self.kv_cache, block_table, cu_seq_lens, self.num_tokens)


def build(small: bool = True):
    """What ``kda-inductor graph-diff examples/indexer_k_gather_demo.py`` compiles."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    seq_lens = [70, 0, 130, 5] if small else [1000 if b % 3 else 333 for b in range(256)]
    cache, table, cu, n = random_indexer_cache(seq_lens, block_size=64, head_dim=128, device=device)
    return IndexerKGather(cache, n), (table, cu)


def graph_us(fn, reps=200) -> float:
    """Median microseconds of one CUDA-graph replay of ``fn``."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    samples = []
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(reps):
        start.record()
        for _ in range(10):
            g.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 100)  # ms / 10 replays -> us
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", action="store_true", help="tiny sizes even on a GPU")
    args = parser.parse_args()
    on_gpu = torch.cuda.is_available()
    # on a GPU the seed workload: 256 requests, every third one shorter
    model, (table, cu) = build(small=args.small or not on_gpu)
    cache, n, device = model.kv_cache, model.num_tokens, model.kv_cache.device
    print(f"indexer K gather: {cu.numel() - 1} requests, {n:,} tokens, block 64, head_dim 128, {device}\n")

    report = kda_inductor.explain(model, table, cu)
    print(report)
    print("\n--- post-grad graph before kda_inductor ---")
    print(report.before)
    print("--- after ---")
    print(report.after)

    compiled = torch.compile(model, backend="kda_inductor")
    values, scales = compiled(table, cu)
    ref_v = torch.empty(n, 128, dtype=torch.uint8, device=device)
    ref_s = torch.empty(n, 4, dtype=torch.uint8, device=device)
    gather_indexer_k_loop(cache, ref_v, ref_s, table, cu)
    same = torch.equal(values.view(torch.uint8), ref_v) and torch.equal(scales.view(torch.uint8), ref_s)
    print(f"check against the eager per-request loop: {'bit-identical' if same else 'MISMATCH'}")
    if not same:
        raise SystemExit(1)

    if on_gpu:
        stock = torch.compile(IndexerKGather(cache, n), backend="inductor")
        times = {
            "eager (vectorized)": graph_us(lambda: model(table, cu)),
            "stock torch.compile": graph_us(lambda: stock(table, cu)),
            "kda_inductor": graph_us(lambda: compiled(table, cu)),
        }
        print("\nCUDA-graph replay medians:")
        for name, us in times.items():
            print(f"  {name:<20} {us:8.1f} us")

    print("\n=== the indexer block: K write (indexer_k_write) + prefill gather (indexer_k_gather) ===")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import indexer_block

    indexer_block.demo(small=args.small or not on_gpu)


if __name__ == "__main__":
    main()
