"""Demo: compile DeepSeek-V3.2's indexer K-cache gather with backend="kda_inductor".

    python examples/indexer_k_gather_demo.py            # tiny on CPU, the seed workload on a GPU
    python examples/indexer_k_gather_demo.py --small    # tiny everywhere

Each part compiles a model with the backend, prints what our pass did (the rewrite table and
the readable before/after diff of the post-grad graph), checks the compiled result against
eager, and on a GPU times eager / stock torch.compile / kda_inductor by CUDA-graph replay
(benchmarks/ has the full benchmarks). Parts:

1. the indexer K-cache gather, checked byte for byte against the seed's per-request loop;
2. the DeepSeek-V3.2-style indexer block of examples/indexer_block.py (K write + gather in
   one model).

On CPU the rewrites are forced (options={"kda": {"force": True}}) so that you can see them:
by default the backend leaves CPU code to Inductor, whose own CPU code is faster than our
ops' CPU implementations. Timings need a GPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

import kda_inductor
from kda_inductor.progress import compile_progress
from kda_inductor.reference import (
    gather_indexer_k,
    gather_indexer_k_loop,
    random_indexer_cache,
    written_cache_mismatch,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import indexer_block  # noqa: E402


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


class Demo:
    """Settings shared by the parts: sizes, device, the compile options."""

    def __init__(self, small: bool):
        self.on_gpu = torch.cuda.is_available()
        self.small = small or not self.on_gpu
        # on CPU, force the rewrites so they show (the speed rules leave CPU code to Inductor)
        self.options = None if self.on_gpu else {"kda": {"force": True}}

    def explain(self, title: str, model, *args) -> kda_inductor.Report:
        """Compile with the backend (caches off), report what our pass did, print it."""
        with compile_progress(title) as step:
            step("compiling (Dynamo, AOTAutograd, our pass, Inductor)")
            report = kda_inductor.Explainer(options=self.options)(model, *args)
        print(report)
        print()
        print(report.diff)
        return report

    def compile(self, model):
        return torch.compile(model, backend="kda_inductor", options=self.options)

    def timings(self, runs: dict[str, Callable[[], object]]) -> None:
        if not self.on_gpu:
            print("timings: skipped (no GPU here; they are CUDA-graph replays on a GPU)")
            return
        print("CUDA-graph replay medians:")
        for name, fn in runs.items():
            print(f"  {name:<20} {graph_us(fn):8.1f} us")


def gather_part(demo: Demo) -> None:
    # on a GPU the seed workload: 256 requests, every third one shorter
    model, (table, cu) = build(small=demo.small)
    cache, n, device = model.kv_cache, model.num_tokens, model.kv_cache.device
    print(f"indexer K gather: {cu.numel() - 1} requests, {n:,} tokens, block 64, head_dim 128, {device}\n")
    with torch.inference_mode():
        demo.explain("indexer K gather", model, table, cu)
        compiled = demo.compile(model)
        with compile_progress("indexer K gather: compiling again to run it"):
            values, scales = compiled(table, cu)
        ref_v = torch.empty(n, 128, dtype=torch.uint8, device=device)
        ref_s = torch.empty(n, 4, dtype=torch.uint8, device=device)
        gather_indexer_k_loop(cache, ref_v, ref_s, table, cu)
    same = torch.equal(values.view(torch.uint8), ref_v) and torch.equal(scales.view(torch.uint8), ref_s)
    print(f"compiled gather against the eager per-request loop: {'bit-identical' if same else 'MISMATCH'}")
    if not same:
        raise SystemExit(1)
    stock = torch.compile(IndexerKGather(cache, n), backend="inductor")
    demo.timings({
        "eager (vectorized)": lambda: model(table, cu),
        "stock torch.compile": lambda: stock(table, cu),
        "kda_inductor": lambda: compiled(table, cu),
    })


def block_part(demo: Demo) -> None:
    block, inputs = indexer_block.build(small=demo.small)
    n = inputs[-1]
    print(f"indexer block: {inputs[0].shape[0]} tokens ({n} real, the rest padding), "
          f"{block.cfg.n_heads} heads, head_dim {block.cfg.head_dim}, {inputs[0].device}\n")
    with torch.inference_mode():
        cache0 = block.kv_cache.clone()
        ref_idx, ref_logits = block(*inputs)
        ref_cache = block.kv_cache.clone()
        block.kv_cache.copy_(cache0)
        demo.explain("indexer block", block, *inputs)
        block.kv_cache.copy_(cache0)
        with compile_progress("indexer block: compiling again to run it"):
            idx, _ = demo.compile(block)(*inputs)
    why = written_cache_mismatch(block.kv_cache, ref_cache, inputs[2], block.cfg.head_dim)
    print(f"K cache written by the compiled block against eager: "
          f"{why or 'identical outside the written slots; written values within one fp8 step'}")
    rows, _ = indexer_block.topk_agreement(ref_idx[:n].cpu(), idx[:n].cpu(), ref_logits[:n].float().cpu())
    if rows:
        print(f"top-k keys: {n - rows} of {n} queries pick exactly eager's keys; {rows} pick a key whose "
              "score ties with eager's choice (within rounding)")
    else:
        print(f"top-k keys: all {n} queries pick exactly eager's keys")
    if why:
        raise SystemExit(1)


PARTS: list[tuple[str, Callable[[Demo], None]]] = [
    ("the indexer K-cache gather (indexer_k_gather)", gather_part),
    ("the indexer block: K write (indexer_k_write) + prefill gather (indexer_k_gather)", block_part),
]
"""The demo's parts, in order: (title, function of the shared settings)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", action="store_true", help="tiny sizes even on a GPU")
    demo = Demo(small=parser.parse_args().small)
    if not demo.on_gpu:
        print("No GPU: tiny sizes on CPU. The rewrites are forced here (options={'kda': {'force': True}}) "
              "to show them: by default the backend leaves CPU code to Inductor, whose CPU code is faster "
              "than our ops' CPU implementations. Timings need a GPU.\n")
    for i, (title, part) in enumerate(PARTS, 1):
        print(f"=== {i}. {title} ===\n")
        part(demo)
        print()


if __name__ == "__main__":
    main()
