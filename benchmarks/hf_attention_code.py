"""Which Inductor kernels feed the attention op in a transformers family's compiled decode step (GPU).

``python -m benchmarks.hf_attention_code [FAMILY] [BATCH] [VARIANT ...]`` (defaults: qwen3_next, 128,
kda and stock) builds the family as ``benchmarks.hf_models`` does (cache of 256 tokens), compiles its
decode step, and prints each generated Triton kernel whose name mentions an sdpa op (its loads, stores
and element count) and the wrapper lines that launch them and the attention op itself: what feeds
the attention, and at which size. Found with it (2026-12-06, H100, transformers 5.17): transformers'
``repeat_kv`` copy of K and V ahead of ``aten._scaled_dot_product_cudnn_attention``
(``hf_models.md``, the 45b9f1b section's notes).
"""

from __future__ import annotations

import re
import sys

import torch


def main(argv: list[str]) -> None:
    from torch._inductor.utils import run_and_get_code

    from benchmarks import hf_models as hm

    family = {f.name: f for f in hm.FAMILIES}[argv[0] if argv else "qwen3_next"]
    batch = int(argv[1]) if len(argv) > 1 else 128
    model, config = hm.build(family, tiny=False, device="cuda")
    step, _ = hm.decode_case(model, config, batch=batch, context=256, device="cuda")
    for variant in argv[2:] or ["kda", "stock"]:
        torch._dynamo.reset()
        compiled = torch.compile(model.model, backend="kda_inductor" if variant == "kda" else "inductor")
        with torch.inference_mode():
            _, codes = run_and_get_code(lambda: step(compiled))
        print(f"##### {variant}: {len(codes)} module(s)")
        for code in codes:
            kernels = r"(triton_\w*(?:cudnn|scaled_dot|efficient|flash)\w*) = async_compile.triton\('[^']*', '''(.*?)'''"
            for m in re.finditer(kernels, code, re.S):
                print("== kernel", m.group(1))
                print("\n".join(line for line in m.group(2).splitlines()
                                if "xnumel =" in line or "tl.load" in line or "tl.store" in line))
            for line in code.splitlines():
                if re.search(r"cudnn_atten|_scaled_dot_product|flash_attention|efficient_attention", line) and \
                        "async_compile" not in line and not line.lstrip().startswith(("#", "def ")):
                    print("  launch:", line.strip()[:300])


if __name__ == "__main__":
    main(sys.argv[1:])
