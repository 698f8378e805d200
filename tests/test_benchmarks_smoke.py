"""CPU smoke test of the benchmarks: their ``--smoke`` paths run without error."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(autouse=True)
def _restore_compile_config():
    """The benchmarks' ``main`` sets Inductor's config for their process (caches off): give the
    tests after them in this worker the config they started with."""
    import torch._functorch.config as aot_config
    import torch._inductor.config as inductor_config

    saved = inductor_config.save_config(), aot_config.save_config()
    yield
    inductor_config.load_config(saved[0])
    aot_config.load_config(saved[1])


def _load(name: str):
    """Import ``benchmarks/<name>.py`` by path (``benchmarks`` is not a package)."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


def test_indexer_k_gather_smoke(capsys):
    """Stock compile, kda_inductor and the loop agree byte for byte on the tiny case."""
    bench = _load("bench_indexer_k_gather")
    rows = bench.main(["--smoke", "--cases", "tiny", "--reps", "1", "--loop-reps", "1"])
    assert [row["case"] for row in rows] == ["tiny"]
    assert rows[0]["stock_us"] is not None and rows[0]["kda_us"] is not None
    assert "NOT meaningful" in capsys.readouterr().out


def test_gdn_spec_split_smoke(capsys):
    """The gdn_spec_split benchmark's checks run on CPU (timings are not meaningful)."""
    bench = _load("bench_gdn_spec_split")
    rows = bench.main(["--smoke"])
    assert [r["T"] for r in rows] == [24]
    assert all(r["kda_us"] > 0 and r["layer_kda_us"] > 0 for r in rows)
    assert "NOT meaningful" in capsys.readouterr().out


def test_indexer_k_write_smoke(capsys):
    """Eager, stock compile and kda_inductor write the same cache on CPU (timings meaningless)."""
    bench = _load("bench_indexer_k_write")
    rows = bench.main(["--smoke", "--cases", "64", "--reps", "1"])
    assert [r["T"] for r in rows] == [64]
    assert all(r["kda_us"] is not None and r["eager_us"] is not None for r in rows)
    assert "NOT meaningful" in capsys.readouterr().out


def test_gated_norm_merge_smoke(capsys):
    """The gated_norm_merge benchmark's checks run on CPU (bit-exact there)."""
    bench = _load("bench_gated_norm_merge")
    rows = bench.main(["--smoke"])
    assert [(row["case"], row["T"]) for row in rows] == [("merge", 12), ("vllm", 12), ("kda4d", 12)]
    assert all(row["max_ulps"] == 0 and row["matched"] == 1 for row in rows)
    assert "NOT meaningful" in capsys.readouterr().out


def test_indexer_asserts_smoke(capsys):
    """The assert-cost benchmark's check and no-check variants write the same bytes (interpreter)."""
    bench = _load("bench_indexer_asserts")
    rows = bench.main(["--smoke", "--reps", "1"])
    assert [(r["op"], r["case"]) for r in rows] == [("gather", "tiny (N=75)"), ("write", "T=1"),
                                                    ("write", "T=1 wrap_negative"), ("write", "T=24"),
                                                    ("write", "T=24 wrap_negative")]
    assert "NOT meaningful" in capsys.readouterr().out


def test_gdn_recurrent_step_smoke(capsys):
    """kda (in place and not), eager transformers and the launch sweep (the kernel under the
    interpreter) agree with the float32 reference on CPU (stock's compile skipped: ~20 s here)."""
    bench = _load("bench_gdn_recurrent_step")
    rows = bench.main(["--smoke", "--no-stock"])
    assert [(r["model"], r["B"], r["T"]) for r in rows] == [("qwen3_next", 1, 1), ("kimi_linear", 2, 3)]
    assert all(r["check"] == "all ok" and r["kda_us"] and r["kda_oop_us"] and r["eager_us"] for r in rows)
    sweep = bench.main(["--smoke", "--sweep"])
    assert len(sweep) == 1 and sweep[0]["us"] is not None
    assert "NOT meaningful" in capsys.readouterr().out
