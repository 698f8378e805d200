"""``TORCH_LOGS=kda_inductor`` / ``+kda_inductor`` (parsed by torch._logging) and the cache-hit line."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import torch

from kda_inductor import logs

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import sys, torch
from tests import graph_targets
opts = {"kda": {"force": True}}
fn, args = graph_targets.build()
torch.compile(fn, backend="kda_inductor", options=opts)(*args)
if "miss" in sys.argv:
    fn, args, _ = graph_targets.interleaved()
    torch._dynamo.reset()
    torch.compile(fn, backend="kda_inductor", options=opts)(*args)
"""


def _run(torch_logs: str, cache: Path, *argv: str) -> str:
    env = {**os.environ, "TORCH_LOGS": torch_logs, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    env.pop("TORCHINDUCTOR_FORCE_DISABLE_CACHES", None)
    done = subprocess.run([sys.executable, "-c", SCRIPT, *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


def test_torch_logs_tables_misses_and_cache_hits(tmp_path):
    debug = _run("+kda_inductor", tmp_path, "miss")
    # INFO: each graph's rewrite table
    assert "kda_inductor: rewrites in this post-grad graph (28 -> 9 nodes):" in debug
    assert re.search(r"indexer_k_gather +1 +22 +3", debug)  # columns as wide as the longest rewrite name
    # DEBUG: the closest misses at the user's source line, with its code
    assert "kda_inductor: closest candidates not rewritten:" in debug
    line = next(ln for ln in debug.splitlines() if "indexer_k_gather: " in ln and "not rewritten: indices differ" in ln)
    assert "graph_targets.py:" in line, line
    info = _run("kda_inductor", tmp_path)  # same code, same cache: Inductor serves the compiled graph
    assert "served from" in info and "the code our pass produced when it was compiled earlier" in info
    # at INFO: why no table and no misses, and how to see them
    assert ("so its rewrite table and its misses (TORCH_LOGS=+kda_inductor) were logged then, not now; "
            "TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 recompiles the graph and logs them") in info
    assert "rewrites in this post-grad graph" not in info and "closest candidates" not in info


def test_torch_logs_names_our_logger():
    """torch._logging maps both spellings onto the kda_inductor logger, at INFO / DEBUG."""
    from torch._logging import _internal

    levels = {}
    for setting in ("kda_inductor", "+kda_inductor"):
        state = _internal._parse_log_settings(setting)
        levels[setting] = dict(state.get_log_level_pairs())["kda_inductor"]
    assert levels == {"kda_inductor": logging.INFO, "+kda_inductor": logging.DEBUG}
    logs.register()
    assert _internal.log_registry.is_log("kda_inductor")


def test_off_by_default_and_set_logs_turns_it_on():
    assert not logs.enabled()  # the compile path only checks isEnabledFor
    try:
        torch._logging.set_logs(modules={"kda_inductor": logging.DEBUG})
        assert logs.enabled() and logs.log.isEnabledFor(logging.DEBUG)
    finally:
        torch._logging.set_logs()
    assert not logs.enabled()
