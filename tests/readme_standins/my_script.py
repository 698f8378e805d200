"""Stand-in for README's ``python my_script.py``: compiles a small model once with the backend."""

import torch

from snippets import build_my_indexer

model, args = build_my_indexer()
with torch.inference_mode():
    torch.compile(model, backend="kda_inductor", options={"kda": {"force": True}})(*args)
