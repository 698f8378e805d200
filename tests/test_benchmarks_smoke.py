"""CPU smoke test of the benchmarks: their ``--smoke`` paths run without error."""

import importlib.util
import os
import re
import sys
from pathlib import Path

import pytest
import torch

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


def test_moe_routing_smoke(capsys):
    """The routing formulations agree on CPU (sorted ids, offsets, the stable ones' permutation), and a
    wrong one is caught: the benchmark's check is what a GPU run's timings rest on."""
    bench = _load("bench_moe_routing")
    rows = bench.main(["--smoke", "--reps", "1"])
    assert [(r["E"], r["S"]) for r in rows] == [(8, 6), (8, 40), (16, 320)]
    assert all(r[f"{name}_us"] > 0 for r in rows for name in bench.FORMS)
    assert "NOT meaningful" in capsys.readouterr().out
    ids = bench.pair_ids(40, 8, "cpu")
    got = {name: fn(ids, 8) for name, fn in bench.FORMS.items()}
    ids_g, perm, offs, inv = got["one_hot"]
    got["one_hot"] = (ids_g, perm.flip(0), offs, inv)  # a permutation that does not sort
    with pytest.raises(SystemExit, match="one_hot: routing differs"):
        bench.check(ids, 8, got)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the check a CPU-only machine takes")
@pytest.mark.parametrize("name", ["bench_gqa_decode_attention", "bench_gdn_chunk", "bench_causal_conv1d",
                                  "bench_gdn_recurrent_step", "bench_gated_norm_quant", "bench_moe_routing",
                                  "bench_mla_decode_absorb", "bench_moe_grouped_mm"])
def test_a_gpu_benchmark_without_a_gpu_says_so(name):
    """A GPU benchmark run without ``--smoke`` on a machine without CUDA stops with its message
    before anything else (a stray local import once turned that check into an UnboundLocalError on
    the device, where it runs past it)."""
    with pytest.raises(SystemExit, match="GPU"):
        _load(name).main([])


def test_moe_grouped_mm_smoke(capsys):
    """The grouped GEMM's launches (interpreter) agree with the groups one by one on CPU; a launch
    that loses rows is flagged; a malformed candidate is refused by name."""
    bench = _load("bench_moe_grouped_mm")
    rows = bench.main(["--smoke", "--reps", "1"])
    assert [(r["E"], r["S"], r["check"]) for r in rows] == [(4, 24, "ok"), (6, 10, "ok")]
    assert "NOT meaningful" in capsys.readouterr().out
    real = bench.L.grouped_triton
    try:  # a kernel that skips the first group's rows: the check must say so
        bench.L.grouped_triton = lambda x, w, offs, out, launch=None, sms=None: real(
            x, w, torch.cat([offs[:1] * 0, offs[1:]]), out.fill_(0), launch=launch, sms=sms)
        assert bench.run("tiny", 4, 24, [], smoke=True, reps=1, bandwidth=None)["check"].startswith("BAD kda")
    finally:
        bench.L.grouped_triton = real
    with pytest.raises(SystemExit, match="--launches"):
        bench.main(["--smoke", "--launches", "32x64"])


def test_gqa_decode_attention_smoke(capsys):
    """The decode attention's checks (against eager, exactly one fold in the kda compile) run on
    CPU at both models' head ratios (timings are not meaningful); a spent budget skips cases."""
    bench = _load("bench_gqa_decode_attention")
    rows = bench.main(["--smoke"])
    assert [(r["model"], r["B"], r["S"]) for r in rows] == [("qwen3_next", 2, 16), ("qwen3_5", 3, 9)]
    assert all(r["kda_us"] > 0 and r["stock_us"] > 0 for r in rows)
    assert "NOT meaningful" in capsys.readouterr().out
    assert bench.main(["--smoke", "--budget", "0"]) == [{"model": "qwen3_next", "B": 2, "S": 16},
                                                       {"model": "qwen3_5", "B": 3, "S": 9}]


def test_mla_decode_absorb_smoke(capsys):
    """The MLA decode attention's checks (against eager, exactly one absorbed attention in the kda
    compile) run on CPU at tiny dims (timings are not meaningful)."""
    bench = _load("bench_mla_decode_absorb")
    rows = bench.main(["--smoke", "--no-record"])
    assert [(r["B"], r["S"]) for r in rows] == [(2, 16), (3, 9)]
    assert all(r["kda_us"] > 0 and r["stock_us"] > 0 for r in rows)
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


def test_gdn_recurrent_step_verify_smoke(capsys):
    """``--verify`` on CPU (T = 2, GDN and KDA) with two candidates (the window body, the persistent one):
    each checked against the float32 reference and timed; the labels round-trip, a bad one is refused."""
    bench = _load("bench_gdn_recurrent_step")
    labels = ["win16w2", "pst16w1x2s2"]
    more = ["seq16w1r128", "seq8w1+scaled", "pst16w1x12s2r168+lazy", "pst16w1x8s2+loop"]
    assert [bench.config_label(bench.parse_config(c)) for c in labels + more] == labels + more
    assert bench.parse_config("win16w1").window and not bench.parse_config("seq16w1").window
    with pytest.raises(SystemExit, match="wdot16w1"):
        bench.parse_config("wdot16w1+tf32x3")
    rows = bench.main(["--smoke", "--verify", "--candidates", ",".join(labels)])
    assert [(r["model"], r["T"]) for r in rows] == [("qwen3_next", 2), ("kimi_linear", 2)]
    assert all("check" not in r and all(r[f"{c}_us"] for c in labels) for r in rows), rows
    assert "NOT meaningful" in capsys.readouterr().out


def test_gdn_chunk_smoke(capsys):
    """kda (its Triton kernels under the interpreter) and eager transformers against the float32
    reference on CPU, T across a chunk; the launch sweep's first configs."""
    bench = _load("bench_gdn_chunk")
    rows = bench.main(["--smoke", "--profile"])
    assert [r["T"] for r in rows] == [70, 130]
    out = capsys.readouterr().out
    assert "NOT meaningful" in out and "kernels per call (torch.profiler" in out  # the per-kernel table (CPU: aten ops)
    # kda2 (the float32 launches), bf16 outputs: ~2^-9 relative rounding (the interpreter truncates: twice that)
    assert all(r["kda2_err"] < 1e-2 and r["kda2_state_err"] < 1e-5 and r["kda_us"] and r["eager_err"] < 1e-2
               for r in rows), rows
    # kda (DEFAULT = FAST) and kda3 (FAST3): bf16 products
    assert all(r[f"{v}_err"] < 3e-2 and r[f"{v}_state_err"] < 3e-2 for r in rows for v in ("kda", "kda3")), rows
    sweep = bench.main(["--smoke", "--sweep"])
    # FAST*: bf16 operands, which the interpreter truncates (twice the rounding error, biased)
    assert [r["config"] for r in sweep] == ["default", "FAST", "FAST inv ieee", "FAST3", "FAST3 inv subst",
                                            "FAST scan4 s3", "FAST out4", "FAST4", "FAST scanout4"]
    assert all(r["us"] is not None and r["err"] < (3e-2 if r["config"] != "default" else 1e-2) for r in sweep)
    # --configs: the named rows only, in that order (any of the full sweep's); an unknown label is an error
    picked = bench.main(["--smoke", "--sweep", "--T", "70", "--configs", "FAST inv tf32,FAST"])
    assert [r["config"] for r in picked] == ["FAST inv tf32", "FAST"] and all(r["err"] < 3e-2 for r in picked)
    # --profile with --configs: those configs' kernels (the v4 scan and output by name)
    capsys.readouterr()
    bench.main(["--smoke", "--sweep", "--T", "70", "--configs", "FAST4", "--profile"])
    assert "FAST4" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="unknown"):
        bench.main(["--smoke", "--sweep", "--configs", "FAST,no such"])


def test_gdn_chunk_kda_smoke(capsys):
    """``--kda``: the KDA launches (bf16 operands, and float32 intermediates) and transformers' eager KDA
    core against the op's float32 token loop on CPU, T across a chunk; its launch sweep's first configs."""
    bench = _load("bench_gdn_chunk")
    rows = bench.main(["--smoke", "--kda"])
    assert [r["T"] for r in rows] == [70, 130]
    assert "gdn_chunk_kda: NOT meaningful" in capsys.readouterr().out
    # bf16 outputs (the interpreter truncates: ~2x 2^-9); kda: bf16 products and intermediates
    assert all(r["kda2_err"] < 1e-2 and r["kda2_state_err"] < 1e-5 and r["eager_err"] < 1e-2 for r in rows), rows
    assert all(r["kda_err"] < 3e-2 and r["kda_state_err"] < 3e-2 and r["kda_us"] for r in rows), rows
    # kda_cols: A / Aqk over 32-column key blocks, the same roundings as kda's
    assert all(r["kda_cols_err"] < 3e-2 and r["kda_cols_state_err"] < 3e-2 and r["kda_cols_us"] for r in rows), rows
    # kda_split: A / Aqk one program per block pair, the same roundings again
    assert all(r["kda_split_err"] < 3e-2 and r["kda_split_state_err"] < 3e-2 and r["kda_split_us"] for r in rows), rows
    sweep = bench.main(["--smoke", "--kda", "--sweep"])
    assert [r["config"] for r in sweep] == ["KDA", "KDA intra bf16", "KDA fp32 inter", "KDA cols 32", "KDA split"]
    assert all(r["us"] is not None and r["err"] < 3e-2 for r in sweep), sweep


# --------------------------------------------------------------------------- benchmarks.hf_models


def _fake_compile(calls):
    """A stand-in for ``hf_models.compile_once`` that checks the cache directories it is
    given (empty for a variant's first compile, its own earlier one for the others) and
    returns a record as a real compile would."""

    def fake(settings, spec, env, timeout):
        folder = Path(env["TORCHINDUCTOR_CACHE_DIR"])
        seen = folder.exists() and any(folder.iterdir())
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "entry").write_text(spec["variant"])
        calls.append((spec["variant"], spec["round"], seen, str(folder)))
        record = {"us": 100.0 + len(calls), "replay_spread": 0.01, "compile_s": 1.0, "timing": "cpu-wall",
                  "caches": {"fx_hit" if seen else "fx_miss": 1},
                  "numerics": {"rows": 2, "max_diff_median": 0.1, "max_diff_max": 0.2, "argmax_agree": 1.0}}
        if spec["variant"].startswith("kda"):
            record["pass_runs"] = 0 if seen else 1
            record["matches"] = {} if seen else {"causal_conv1d": 3, "gated_norm_merge": 0}
        return record

    return fake


def test_hf_models_compile_loop_alternates_and_writes_one_commit_section(tmp_path, monkeypatch):
    """Three compiles per variant, variants alternating; the first of each on an empty cache
    directory of its own, the others reading it; kda-no-<rewrite> for the rewrite that fired in
    kda's first compile; one section of this commit in a temporary results dir (refusing no row
    of its own commit), rendered into the markdown between its markers."""
    import json

    from benchmarks import _hf_record, hf_models

    calls = []
    monkeypatch.setattr(hf_models, "compile_once", _fake_compile(calls))
    argv = ["--smoke", "--family", "qwen3_next", "--case", "decode32", "--results-dir", str(tmp_path / "res"),
            "--cache-root", str(tmp_path / "caches")]
    records = hf_models.main(argv)
    order = [(v, r) for v, r, _, _ in calls]
    assert order == [("eager", 0), ("stock", 0), ("kda", 0), ("kda-no-causal_conv1d", 0),
                     ("stock", 1), ("kda", 1), ("kda-no-causal_conv1d", 1),
                     ("stock", 2), ("kda", 2), ("kda-no-causal_conv1d", 2)]
    assert [seen for v, r, seen, _ in calls if v != "eager"] == [False] * 3 + [True] * 6
    assert len({folder for *_, folder in calls}) == 4  # one cache per variant
    assert [r["cache"] for r in records if r["variant"] == "kda"] == ["cold", "warm", "warm"]
    state = _hf_record.source_state()
    data = json.loads((tmp_path / "res" / "hf_models.json").read_text())
    (section,) = data["sections"]
    assert section["commit"] == state["commit"] and section["source"] == state["source"]
    assert len(section["records"]) == 10 and {r["source"] for r in section["records"]} == {state["source"]}
    md = (tmp_path / "res" / "hf_models.md").read_text()
    assert f"commit {state['commit'][:10]}" in md and md.count("<!-- hf-section") == 1
    kda = next(r for r in hf_models.summarize(section["records"]) if r["variant"] == "kda")
    assert kda["compiles"] == "3" and kda["cold_us"] == 103.0 and kda["caches"] == "M H H"
    assert kda["spread"] == (109.0 - 103.0) / 106.0 and kda["rewrites"] == "causal_conv1d 3"
    # a second call at the same commit: the same section, its rows replaced where measured again
    hf_models.main(argv + ["--variant", "stock", "--compiles", "1"])
    assert calls[-1][:3] == ("stock", 0, False)  # the cold compile's directory was emptied first
    data = json.loads((tmp_path / "res" / "hf_models.json").read_text())
    (section,) = data["sections"]
    assert len(section["calls"]) == 2 and len(section["records"]) == 8
    md = (tmp_path / "res" / "hf_models.md").read_text()
    assert md.count("<!-- hf-section") == 1 and md.count("- call ") == 2


def test_hf_cache_modes_keep_inductors_cache_per_variant(tmp_path):
    """``fresh``: Inductor's and Triton's caches per variant, emptied for its first compile;
    ``fresh-inductor``: Inductor's the same, Triton's one for the run (with its autotune cache)."""
    from benchmarks import hf_models

    for mode in ("fresh", "fresh-inductor"):
        settings = hf_models.RunSettings(caches=mode, cache_root=str(tmp_path / mode))
        envs = [hf_models._cache_env(settings, "qwen3_next", "decode32", v, r) for v, r in
                (("stock", 0), ("kda", 0), ("kda", 1))]
        assert len({e["TORCHINDUCTOR_CACHE_DIR"] for e in envs}) == 2  # per variant
        assert len({e["TRITON_CACHE_DIR"] for e in envs}) == (1 if mode == "fresh-inductor" else 2)
        assert ("TRITON_CACHE_AUTOTUNING" in envs[0]) == (mode == "fresh-inductor")
        (Path(envs[1]["TORCHINDUCTOR_CACHE_DIR"]) / "x").parent.mkdir(parents=True, exist_ok=True)
        (Path(envs[1]["TORCHINDUCTOR_CACHE_DIR"]) / "x").write_text("")
        hf_models._cache_env(settings, "qwen3_next", "decode32", "kda", 0)  # a cold compile again: emptied
        assert not (Path(envs[1]["TORCHINDUCTOR_CACHE_DIR"]) / "x").exists()


def test_hf_models_budget_starts_nothing_after_it(tmp_path, monkeypatch):
    """``--budget``: no compile starts once it is spent; what ran is recorded and what was not
    started is named in the section."""
    from benchmarks import hf_models

    calls = []
    monkeypatch.setattr(hf_models, "compile_once", _fake_compile(calls))
    monkeypatch.setattr(hf_models.Budget, "spent", lambda self: len(calls) >= 4)
    records = hf_models.main(["--smoke", "--family", "qwen3_next", "--case", "decode32", "--budget", "60",
                              "--results-dir", str(tmp_path), "--cache-root", str(tmp_path / "c")])
    assert [r["variant"] for r in records] == ["eager", "stock", "kda", "kda-no-causal_conv1d"]
    md = (tmp_path / "hf_models.md").read_text()
    assert "ran qwen3_next decode32 (4 compiles); not started (budget): qwen3_next decode32 stock #2; " \
           "qwen3_next decode32 kda #2; qwen3_next decode32 kda-no-causal_conv1d #2; " \
           "qwen3_next decode32 stock #3" in md


def test_hf_section_refuses_rows_of_another_commit():
    """A section is one run at one commit: a record of another source state (or another
    environment) is refused; records of the same state go in, one call's twice replace."""
    from benchmarks import _hf_record

    env = {"gpu": "H200", "torch": "2.11", "triton": "3.6", "transformers": "5.17", "fla": "0.6.0"}
    a = {"commit": "a" * 40, "dirty": False, "source": "a" * 40}
    b = {"commit": "b" * 40, "dirty": False, "source": "b" * 40}
    section = _hf_record.Section.new(a, env)
    row = {"family": "qwen3_next", "case": "decode32", "variant": "kda", "round": 0, "us": 1.0}
    section.add({"id": "c1", "started": "t"}, [{**row, "source": a["source"], "env": env}])
    with pytest.raises(ValueError, match="one run, one commit"):
        section.add({"id": "c2", "started": "t"}, [{**row, "source": b["source"], "env": env}])
    with pytest.raises(ValueError, match="one run, one commit"):
        section.add({"id": "c2", "started": "t"}, [{**row, "source": a["source"], "env": {**env, "torch": "2.13"}}])
    assert len(section["records"]) == 1
    sections = []
    _hf_record.merge_into(sections, a, env, {"id": "c1", "started": "t"}, [{**row, "source": a["source"], "env": env}])
    _hf_record.merge_into(sections, b, env, {"id": "c2", "started": "t"}, [{**row, "source": b["source"], "env": env}])
    assert [s["commit"] for s in sections] == ["a" * 40, "b" * 40]


def test_hf_merge_remark_notes_one_commits_section(tmp_path):
    """``--merge ... --at C --remark TEXT``: the note lands in commit C's section (json and markdown),
    once however often it is given; a commit with no section is refused by name."""
    from benchmarks import _hf_record, hf_models

    env = {"gpu": "H100", "torch": "2.11", "triton": "3.6", "transformers": "5.17", "fla": "0.6.0"}
    for c in "ab":
        state = {"commit": c * 40, "dirty": False, "source": c * 40}
        s = _hf_record.Section.new(state, env)
        s.add({"id": f"call-{c}", "started": "2026-12-07 18:37 UTC"},
              [{"family": "qwen3_next", "case": "decode32", "variant": "kda", "round": 0, "us": 1.0,
                "call": f"call-{c}", "source": state["source"], "env": env}])
        _hf_record.save_sections(tmp_path / f"{c}.json", [s])
    files = [str(tmp_path / "a.json"), str(tmp_path / "b.json")]
    for _ in range(2):
        sections = hf_models._merge(files, tmp_path, "kimi prefill stock: no compile in a call", "bbbb")
        files = [str(tmp_path / "hf_models.json")]
    assert [s.get("remarks", []) for s in sections] == [[], ["kimi prefill stock: no compile in a call"]]
    assert (tmp_path / "hf_models.md").read_text().count("- note: kimi prefill stock: no compile in a call") == 1
    with pytest.raises(SystemExit, match="no section of commit 'cccc'"):
        hf_models._merge(files, tmp_path, "x", "cccc")


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_hf_merge_keeps_the_newest_call_of_a_variant_in_any_file_order(tmp_path, order):
    """Two device calls' copies of hf_models.json, each holding the section's older calls: a
    variant measured again (here: one that failed first) keeps the newer call's records whichever
    file comes first, and every other variant keeps its own."""
    import json

    from benchmarks import _hf_record

    env = {"gpu": "H100", "torch": "2.11", "triton": "3.6", "transformers": "5.17", "fla": "0.6.0"}
    a = {"commit": "a" * 40, "dirty": False, "source": "a" * 40}

    def rec(call, family, us):
        return {"family": family, "case": "decode128", "variant": "kda", "round": 0, "us": us, "call": call,
                "source": a["source"], "env": env}

    old = _hf_record.Section.new(a, env)
    old.add({"id": "c0", "started": "2026-12-05 19:21 UTC"}, [rec("c0", "olmo", None), rec("c0", "kimi", 1.0)])
    files = []
    for i, (call, family, us) in enumerate([("c1", "olmo", 2.0), ("c2", "kimi", 3.0)]):
        s = _hf_record.Section(json.loads(json.dumps(old)))
        s.add({"id": call, "started": f"2026-12-06 03:2{4 + i} UTC"}, [rec(call, family, us)])
        files.append(tmp_path / f"{i}.json")
        _hf_record.save_sections(files[-1], [s])
    merged = _hf_record.merge_files([files[i] for i in order])
    assert len(merged) == 1
    got = {(r["family"], r["call"]): r["us"] for r in merged[0]["records"]}
    assert got == {("olmo", "c1"): 2.0, ("kimi", "c2"): 3.0}
    assert [c["id"] for c in merged[0]["calls"]] == ["c0", "c1", "c2"]


def test_hf_markdown_section_replaced_in_place(tmp_path):
    """The markdown keeps text outside a section's markers and replaces the section itself."""
    from benchmarks import _hf_record

    path = tmp_path / "hf.md"
    path.write_text("# t\n\n## an older section\n\nits rows\n")
    section = {"id": "x|y"}
    _hf_record.write_markdown(path, "t", "", section, "## first\n")
    path.write_text(path.read_text() + "\nnotes after it\n")
    _hf_record.write_markdown(path, "t", "", section, "## second\n")
    text = path.read_text()
    assert "## an older section" in text and "notes after it" in text
    assert "## second" in text and "## first" not in text and text.count("<!-- hf-section x|y -->") == 1


def test_hf_stamp_names_the_commit_of_a_tree_without_git(tmp_path):
    """A copy of the tree without .git: the stamp's blob hashes (git's) name its commit; a
    changed file, a missing one, or a new .py under kda_inductor/ make it dirty."""
    import subprocess

    from benchmarks import _hf_record

    readme = Path(__file__).resolve().parent.parent / "README.md"
    git = subprocess.run(["git", "hash-object", str(readme)], capture_output=True, text=True)
    if git.returncode == 0:
        assert _hf_record.blob_hash(readme.read_bytes()) == git.stdout.strip()
    (tmp_path / "kda_inductor").mkdir()
    files = {"kda_inductor/a.py": b"x = 1\n", "README.md": b"hi\n", "benchmarks/results/r.json": b"old\n"}
    for rel, data in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(data)
    stamp = {"commit": "c" * 40, "files": {rel: _hf_record.blob_hash(d) for rel, d in files.items()}}
    (tmp_path / _hf_record.STAMP).write_text(__import__("json").dumps(stamp))
    state = _hf_record.source_state(tmp_path)
    assert (state["commit"], state["dirty"], state["source"], state["how"]) == ("c" * 40, False, "c" * 40, "stamp")
    (tmp_path / "benchmarks/results/r.json").write_text("a run's results\n")  # results never make it dirty
    assert not _hf_record.source_state(tmp_path)["dirty"]
    (tmp_path / "kda_inductor/new.py").write_text("y = 2\n")
    state = _hf_record.source_state(tmp_path)
    assert state["dirty"] and state["changed"] == ["kda_inductor/new.py"] and state["source"].startswith("c" * 40 + "+dirty-")
    (tmp_path / "kda_inductor/new.py").unlink()
    (tmp_path / "README.md").write_text("changed\n")
    assert _hf_record.source_state(tmp_path)["changed"] == ["README.md"]
    # a stale .git beside matching files (the device tool's copy): the stamp names the commit
    (tmp_path / "README.md").write_bytes(b"hi\n")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=x", "-c", "user.email=x@x", "commit", "-q",
                    "--allow-empty", "-m", "old"], check=True)
    state = _hf_record.source_state(tmp_path)
    assert (state["commit"], state["dirty"], state["how"]) == ("c" * 40, False, "stamp")
    (tmp_path / "README.md").write_text("changed\n")  # the stamp no longer describes the files: git's answer
    assert _hf_record.source_state(tmp_path)["how"] == "git"


def test_hf_git_state_counts_tracked_changes_and_untracked_code_only(tmp_path):
    """A git checkout: an untracked note or script outside the code folders (the device tool's carried
    ``.dev/``) leaves it clean; a new ``.py`` under ``kda_inductor/`` or a changed tracked file makes it
    dirty; results never do."""
    import subprocess

    from benchmarks import _hf_record

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=x", "-c", "user.email=x@x", *args], check=True)

    (tmp_path / "kda_inductor").mkdir()
    (tmp_path / "kda_inductor/a.py").write_text("x = 1\n")
    (tmp_path / "README.md").write_text("hi\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "c")
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    (tmp_path / ".dev").mkdir()
    (tmp_path / ".dev/run.sh").write_text("echo\n")
    (tmp_path / ".dev/tool.py").write_text("y = 1\n")
    (tmp_path / "benchmarks/results").mkdir(parents=True)
    (tmp_path / "benchmarks/results/r.json").write_text("{}\n")
    state = _hf_record.source_state(tmp_path)
    assert (state["commit"], state["dirty"], state["source"], state["how"]) == (head, False, head, "git")
    (tmp_path / "kda_inductor/new.py").write_text("z = 2\n")
    assert _hf_record.source_state(tmp_path)["changed"] == ["kda_inductor/new.py"]
    (tmp_path / "kda_inductor/new.py").unlink()
    (tmp_path / "README.md").write_text("changed\n")
    state = _hf_record.source_state(tmp_path)
    assert state["dirty"] and state["changed"] == ["README.md"] and state["source"].startswith(head + "+dirty-")


def test_hf_legacy_rows_become_sections_of_unknown_commit():
    """The recorded hf_models.json: every section names its commit (or says it is unknown)."""
    from benchmarks import _hf_record, hf_models

    sections = _hf_record.load_sections(hf_models.RESULTS / "hf_models.json")
    assert sections and all(s["commit"] for s in sections)
    assert all(s["commit"] == "unknown" for s in sections if s.get("legacy_rows"))
    for s in sections:  # no section mixes commits
        assert len({r.get("source") for r in s.get("records", [])}) <= 1


def test_hf_plan_covers_every_case_within_a_call():
    """``--plan``: every variant of every (family, case) of the stage is in one proposed call,
    by name (a split case needs no kda run in the same call), no lane over its seconds."""
    from benchmarks import _hf_record, hf_models

    sections = _hf_record.load_sections(hf_models.RESULTS / "hf_models.json")
    fams = [hf_models.BY_NAME[n] for n in hf_models.STAGE]
    rows, calls = hf_models.plan(sections, fams, list(hf_models.TABLE_CASES), 3, 480.0, lanes=2)
    assert len(rows) == len(fams) * 3 and all(len(call) <= 2 for call in calls)
    jobs = [job for call in calls for lane in call for job in lane]
    for r in rows:
        for variant in r["per_variant_s"]:
            assert sum(f"--family {r['family']} --case {r['case']} " in j and
                       variant in j.split(" --variant ")[1].split(" ")[0].split(",") for j in jobs) == 1, \
                (r["family"], r["case"], variant)
    assert all("kda-no-*" not in j for j in jobs)
    lane_s = [sum(float(j.rsplit("(~", 1)[1].split(" ")[0]) for j in lane) for call in calls for lane in call]
    assert max(lane_s) <= 480.0 + 1


def test_hf_table_recipe_gives_stock_cold_compiles_on_fresh_caches(tmp_path, monkeypatch):
    """``--recipe table``: stock ``--compiles`` times, each on an empty cache of its own (a warm
    compile would repeat the cold one's autotune choice); kda once cold and once warm (reading
    its cold compile's cache); the kda-no-<rewrite> of ``TABLE_KEY_REWRITE`` where it fired, once,
    cold; eager once."""
    from benchmarks import hf_models

    calls = []
    monkeypatch.setattr(hf_models, "compile_once", _fake_compile(calls))
    records = hf_models.main(["--smoke", "--family", "qwen3_next", "--case", "decode32", "--recipe", "table",
                              "--results-dir", str(tmp_path), "--cache-root", str(tmp_path / "c")])
    assert [(v, r, seen) for v, r, seen, _ in calls] == [  # causal_conv1d fired: not decode's key rewrite
        ("eager", 0, False), ("stock", 0, False), ("kda", 0, False),
        ("stock", 1, False), ("kda", 1, True), ("stock", 2, False)]
    stock_dirs = [folder for v, _, _, folder in calls if v == "stock"]
    assert len(set(stock_dirs)) == 3
    kda_dirs = [folder for v, _, _, folder in calls if v == "kda"]
    assert kda_dirs[0] == kda_dirs[1]
    assert [r["cache"] for r in records if r["variant"] == "stock"] == ["cold"] * 3
    assert [r["cache"] for r in records if r["variant"] == "kda"] == ["cold", "warm"]
    stock = next(r for r in hf_models.summarize(records) if r["variant"] == "stock")
    assert stock["compiles"] == "3" and stock["spread"] is not None


def test_hf_compile_limit_records_a_compile_too_slow_to_wait_for(tmp_path, monkeypatch):
    """``--compile-limit``: each compile's process gets at most that long; one killed at it is a
    failed row naming the limit (not the budget), the plan counts that variant at the limit, and
    the bar takes the case as measured where stock+fix compiled (a stock no user would wait for)."""
    from benchmarks import _hf_record, hf_models
    from kda_inductor import _dynamo_fixes

    calls, real = [], _fake_compile([])

    def fake(settings, spec, env, timeout):
        calls.append((spec["variant"], timeout))
        if spec["variant"] == "stock":
            return {"error": f"killed after {timeout:.0f} s (the run's budget + grace)"}
        record = real(settings, spec, env, timeout)
        return {**record, "us": 50.0} if spec["variant"] == "kda" else record

    monkeypatch.setattr(hf_models, "compile_once", fake)
    monkeypatch.setattr(_dynamo_fixes, "torch_folds_is_exporting", lambda: True)  # stock+fix runs
    records = hf_models.main(["--smoke", "--family", "qwen3_next", "--case", "prefill", "--recipe", "table",
                              "--variant", "stock,stock+fix,kda", "--compile-limit", "7", "--budget", "900",
                              "--results-dir", str(tmp_path), "--cache-root", str(tmp_path / "c")])
    assert all(t == 7 for _, t in calls) and [v for v, _ in calls].count("stock") == 3
    stock = [r for r in records if r["variant"] == "stock"]
    assert all(r["compile_limit_s"] == 7 and "--compile-limit 7 s" in r["error"] for r in stock)
    row = next(r for r in hf_models.summarize(records) if r["variant"] == "stock")
    assert row["us"] is None and row["compiles"] == "0 (+3 failed)" and "--compile-limit" in row["error"]
    (section,) = _hf_record.load_sections(tmp_path / "hf_models.json")
    problems = hf_models.check_section(section)
    assert problems == ["0 families with decode and prefill measured (none); the table needs 4 "
                        "(measured at all: qwen3_next)"], problems  # the prefill case counted, kda not above
    fam = [hf_models.BY_NAME["qwen3_next"]]
    rows, _ = hf_models.plan([section], fam, ["prefill"], 3, 480.0, recipe="table", jobs=1,
                             variants=["stock", "stock+fix"])
    per = rows[0]["per_variant_s"]  # stock+fix at its recorded 1 s a compile, stock at the limit
    assert per["stock"] - per["stock+fix"] == pytest.approx(3 * (7 - 1.0))
    # without the limit a killed compile is the budget's, and says so
    calls.clear()
    records = hf_models.main(["--smoke", "--family", "qwen3_next", "--case", "prefill", "--variant", "stock",
                              "--compiles", "1", "--no-record", "--cache-root", str(tmp_path / "d")])
    assert "budget" in records[0]["error"] and "compile_limit_s" not in records[0]


def test_hf_no_fla_variants_run_as_their_base_with_fla_hidden(tmp_path, monkeypatch):
    """``kda@no-fla``: compiled as kda is (cold, then warm on its own cache), ranked after it, its
    ratio to kda reported; ``hide_fla`` leaves an installed fla unimportable in that process."""
    import subprocess
    import sys

    from benchmarks import hf_models

    calls = []
    monkeypatch.setattr(hf_models, "compile_once", _fake_compile(calls))
    records = hf_models.main(["--smoke", "--family", "qwen3_next", "--case", "decode32", "--recipe", "table",
                              "--variant", "kda,kda@no-fla,stock@no-cudnn-sdp", "--results-dir", str(tmp_path),
                              "--cache-root", str(tmp_path / "c")])
    assert [(v, r, seen) for v, r, seen, _ in calls] == [
        ("stock@no-cudnn-sdp", 0, False), ("kda", 0, False), ("kda@no-fla", 0, False),
        ("stock@no-cudnn-sdp", 1, False), ("kda", 1, True), ("kda@no-fla", 1, True), ("stock@no-cudnn-sdp", 2, False)]
    assert len({folder for v, _, _, folder in calls}) == 5  # stock's three cold compiles, kda's, kda@no-fla's
    row = next(r for r in hf_models.summarize(records) if r["variant"] == "kda@no-fla")
    assert row["vs_kda"] is not None
    (tmp_path / "fla").mkdir()
    (tmp_path / "fla" / "__init__.py").write_text("")
    probe = ("import importlib.util as u; from benchmarks._hf_sched import hide_fla; "
             "assert u.find_spec('fla') is not None; assert hide_fla() is None; assert u.find_spec('fla') is None\n"
             "try:\n    import fla\nexcept ImportError:\n    print('hidden')")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.getcwd()])}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "hidden", out.stderr


def test_hf_parallel_compiles_keep_warm_after_cold_and_record_everything(tmp_path, monkeypatch):
    """``--jobs 3``: compiles overlap (several run at once), a warm compile starts only after
    the cold compile whose cache it reads has finished, every compile is recorded once, and
    the specs name one GPU lock file for the run."""
    import threading
    import time as _time

    from benchmarks import hf_models

    finished, running, overlap, specs = set(), set(), [], []
    guard = threading.Lock()

    def fake(settings, spec, env, timeout):
        key = (spec["family"], spec["case"], spec["variant"], spec["round"])
        state = hf_models.cache_state(settings, spec["round"], spec["variant"])
        if state == "warm":
            assert (spec["family"], spec["case"], spec["variant"], 0) in finished, key
        with guard:
            running.add(key)
            overlap.append(len(running))
            specs.append(spec)
        _time.sleep(0.05)
        with guard:
            running.discard(key)
            finished.add(key)
        record = {"us": 100.0, "compile_s": 1.0, "caches": {}}
        if spec["variant"] == "kda" and spec["round"] == 0:
            record.update(pass_runs=1, matches={"causal_conv1d": 3})
        return record

    monkeypatch.setattr(hf_models, "compile_once", fake)
    records = hf_models.main(["--smoke", "--family", "qwen3_next", "--case", "decode32", "--case", "prefill",
                              "--recipe", "table", "--jobs", "3", "--results-dir", str(tmp_path),
                              "--cache-root", str(tmp_path / "c")])
    from kda_inductor import _dynamo_fixes

    keys = [(r["case"], r["variant"], r["round"]) for r in records]
    fix = 3 if _dynamo_fixes.torch_folds_is_exporting() else 0  # stock+fix x3 a case where this torch folds
    # kda-no-causal_conv1d in prefill only (the table's key rewrite; decode's is gdn_recurrent_step)
    assert len(keys) == len(set(keys)) == 6 + 7 + 2 * fix
    assert max(overlap) > 1
    assert {s["gpu_lock"] for s in specs} == {str(tmp_path / "c" / "gpu.lock")}


def test_gpu_lock_excludes_other_holders_and_counts_the_wait(tmp_path):
    """Two ``GpuLock`` objects on one file (two processes of a run): the second waits until the
    first lets go, and counts the wait; re-entrant acquire is free; no path: always free."""
    import threading
    import time as _time

    from benchmarks._hf_sched import GpuLock

    path = str(tmp_path / "gpu.lock")
    a, b = GpuLock(path), GpuLock(path)
    a.acquire()
    a.acquire()  # re-entrant
    got = threading.Event()
    t = threading.Thread(target=lambda: (b.acquire(), got.set()))
    t.start()
    _time.sleep(0.3)
    assert not got.is_set()
    a.release()
    t.join(5)
    assert got.is_set() and b.waited >= 0.25 and a.held() >= 0.25
    b.release()
    free = GpuLock(None)
    with free.during():
        assert free.fd is None and free.waited == 0.0


def test_gpu_memory_admits_a_build_only_beside_claims_it_fits(tmp_path):
    """``GpuMemory``: an unmeasured (family, case) claims its share of the card; a claim that does not
    fit beside a live process's waits (the lock given back) until that one ends; the peak a
    finished process recorded is what the next of its case claims; claims of dead processes drop."""
    import json
    import subprocess
    import sys
    import threading

    from benchmarks._hf_sched import GpuLock, GpuMemory

    path, total = str(tmp_path / "gpu.lock.mem.json"), 100
    mem = GpuMemory(path, unknown=0.6, poll_s=0.05)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with open(path, "w") as f:  # a live process claims 60 of 100
            json.dump({"claims": {str(other.pid): 60}, "peaks": {}}, f)
        assert not mem.try_claim("a/decode", total)
        lock, admitted = GpuLock(str(tmp_path / "gpu.lock")), threading.Event()
        lock.acquire()
        t = threading.Thread(target=lambda: (mem.admit(lock, "a/decode", total), admitted.set()))
        t.start()
        t.join(0.3)
        assert not admitted.is_set() and lock.fd is None  # waiting, the lock given back
    finally:
        other.kill()
        other.wait()
    t.join(5)
    assert admitted.is_set() and lock.fd is not None
    lock.release()
    mem.done("a/decode", 20)
    data = json.load(open(path))
    assert data == {"claims": {}, "peaks": {"a/decode": 20}}
    with open(path, "w") as f:  # a live claim of 70: a measured 20 fits, an unmeasured 60 does not
        json.dump({"claims": {str(os.getppid()): 70}, "peaks": {"a/decode": 20}}, f)
    assert mem.try_claim("a/decode", total) and not mem.try_claim("b/prefill", total)
    assert GpuMemory(None).try_claim("any", total)
    # a case seen before (KNOWN_PEAKS_GIB) claims that much, not the unmeasured share: on an 80 GiB
    # card beside a live 20 GiB claim, DeepSeek-V3.2 decode 128 (66 GiB) waits, an unmeasured case fits
    gib = 1 << 30
    with open(path, "w") as f:
        json.dump({"claims": {str(os.getppid()): 20 * gib}, "peaks": {}}, f)
    assert not mem.try_claim("deepseek_v32/decode128", 80 * gib)
    assert GpuMemory(path, unknown=0.3).try_claim("b/prefill", 80 * gib)


def test_gpu_lock_is_free_while_dynamo_compiles_and_taken_when_it_ends(tmp_path):
    """``from_compile_end``: during the compile (inside the backend) another process may hold the
    GPU; once Dynamo's compile ends, before the compiled code runs, this process holds it."""
    import torch

    from benchmarks._hf_sched import GpuLock

    lock = GpuLock(str(tmp_path / "gpu.lock"))
    seen = {}

    def backend(gm, example_inputs):
        seen["during_compile"] = lock.fd is not None
        return gm.forward

    @torch.compiler.disable
    def probe(x):  # runs eagerly after the compiled graph before it: what the compiled code's first call does
        seen["while_running"] = lock.fd is not None
        return x + 1

    fn = torch.compile(lambda x: probe(x * 2), backend=backend)
    torch._dynamo.reset()
    with lock.from_compile_end():
        fn(torch.ones(3))
    assert seen == {"during_compile": False, "while_running": True}
    lock.release()


def test_quiet_lock_times_only_when_no_other_process_compiles(tmp_path):
    """``QuietLock``: while one process compiles (shared) another's timing (exclusive) waits, and
    counts the wait; two compiles share it; no path: always free."""
    import threading
    import time as _time

    from benchmarks._hf_sched import QuietLock

    path = str(tmp_path / "quiet.lock")
    a, b, timer = QuietLock(path), QuietLock(path), QuietLock(path)
    a.shared()
    b.shared()  # two compiles at once: no wait
    assert b.waited < 0.2
    timed = threading.Event()

    def time_it():
        with timer.exclusive():
            timed.set()

    t = threading.Thread(target=time_it)
    t.start()
    _time.sleep(0.3)
    a.release()
    _time.sleep(0.2)
    assert not timed.is_set()  # b still compiles
    b.release()
    t.join(5)
    assert timed.is_set() and timer.waited >= 0.45 and timer.fd is None
    free = QuietLock(None)
    with free.exclusive():
        assert free.fd is None and free.waited == 0.0


def test_generate_builds_its_model_under_the_quiet_lock(tmp_path, monkeypatch):
    """``hf_generate.run_one``: the model's build (CPU weight init on every core) holds the quiet lock
    shared, so no other process times meanwhile; released after it (a timing may follow)."""
    import fcntl
    import os

    from benchmarks import hf_generate, hf_models

    path, seen = str(tmp_path / "quiet.lock"), {}

    def try_exclusive() -> bool:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False
        finally:
            os.close(fd)

    def build(*_a, **_k):
        seen["timing could start"] = try_exclusive()

    monkeypatch.setattr(hf_models, "build", build)
    got = hf_generate.run_one({"smoke": True, "device": "cpu", "variant": "stock", "family": "qwen3_next",
                               "quiet_lock": path, "gpu_lock": str(tmp_path / "gpu.lock")})
    assert got == {"error": "not in this transformers"} and seen == {"timing could start": False}
    assert try_exclusive()


def test_outside_compiles_holds_quiet_shared_only_while_compiling(tmp_path):
    """``outside_compiles(lock, quiet)``: during Dynamo's compile the GPU lock is free and the quiet
    lock held shared; after it, the GPU lock held and the quiet lock free (never both at once)."""
    import torch

    from benchmarks._hf_sched import GpuLock, QuietLock, outside_compiles

    lock, quiet = GpuLock(str(tmp_path / "gpu.lock")), QuietLock(str(tmp_path / "quiet.lock"))
    seen = {}

    def backend(gm, example_inputs):
        seen["compiling"] = (lock.fd is not None, quiet.fd is not None)
        return gm.forward

    @torch.compiler.disable
    def probe(x):
        seen["running"] = (lock.fd is not None, quiet.fd is not None)
        return x + 1

    fn = torch.compile(lambda x: probe(x * 2), backend=backend)
    torch._dynamo.reset()
    with outside_compiles(lock, quiet):
        fn(torch.ones(3))
    assert seen == {"compiling": (False, True), "running": (True, False)}
    assert quiet.fd is None
    lock.release()


def test_hf_plan_with_parallel_compiles_needs_fewer_calls():
    """``--plan --jobs N``: compiles that overlap need fewer device calls than one at a time, and
    every lane stays within its seconds; the table recipe is planned as it runs."""
    from benchmarks import _hf_record, hf_models

    sections = _hf_record.load_sections(hf_models.RESULTS / "hf_models.json")
    fams = [hf_models.BY_NAME[n] for n in hf_models.STAGE]
    _, serial = hf_models.plan(sections, fams, list(hf_models.TABLE_CASES), 3, 480.0, recipe="table", jobs=1)
    rows, parallel = hf_models.plan(sections, fams, list(hf_models.TABLE_CASES), 3, 480.0, recipe="table", jobs=6)
    assert len(parallel) < len(serial)
    lane_s = [sum(float(j.rsplit("(~", 1)[1].split(" ")[0]) for j in lane) for call in parallel for lane in call]
    assert max(lane_s) <= 480.0 + 1
    assert all(r["gpu_s"] > 0 for r in rows)


def _bar_records(families, slow_kda=None, one_stock=None):
    out = []
    for fam in families:
        for case in ("decode32", "prefill"):
            for variant, rounds, us in (("stock", 3, 100.0), ("kda", 2, 80.0)):
                for r in range(rounds):
                    if (fam, case) == one_stock and variant == "stock" and r > 0:
                        continue
                    value = 120.0 if (fam, case) == slow_kda and variant == "kda" else us + r
                    out.append({"family": fam, "case": case, "variant": variant, "round": r,
                                "cache": "cold", "us": value, "mode": "fresh"})
    return out


def test_hf_check_names_what_the_table_lacks():
    """``--check``: four families with decode and prefill clear the bar; fewer families, a stock
    measured once (no spread), or kda slower than stock anywhere are each named."""
    from benchmarks import hf_models

    four = ["qwen3_next", "qwen3_5", "kimi_linear", "olmo_hybrid"]
    assert hf_models.check_section({"records": _bar_records(four)}) == []
    short = hf_models.check_section({"records": _bar_records(four[:2])})
    assert len(short) == 1 and "2 families with decode and prefill" in short[0]
    slow = hf_models.check_section({"records": _bar_records(four, slow_kda=("qwen3_5", "prefill"))})
    assert slow == ["qwen3_5 prefill: kda 120 us above stock 101 us"]  # the median of 100, 101, 102
    once = hf_models.check_section({"records": _bar_records(four, one_stock=("kimi_linear", "decode32"))})
    assert once == ["kimi_linear decode32: stock has one compile (no spread)"]


def test_hf_recorded_newest_section_never_has_kda_above_stock():
    """The newest GPU section recorded: whatever it covers, kda is nowhere slower than stock
    (the table's coverage is what ``--check`` reports; it grows over device calls)."""
    from benchmarks import _hf_record, hf_models

    section = hf_models.newest_gpu_section(_hf_record.load_sections(hf_models.RESULTS / "hf_models.json"))
    assert section is not None
    assert [p for p in hf_models.check_section(section) if "above" in p] == []


@pytest.mark.slow
def test_hf_models_smoke_three_compiles_in_fresh_processes(tmp_path):
    """The real thing on CPU (tiny Qwen3-Next, 2 layers): stock and kda compiled three times
    each, each compile in a fresh process, every output checked against eager in the worker;
    the warm compiles are FX graph cache hits (our pass does not run, its ops still do), the
    section names this commit."""
    from benchmarks import hf_models

    records = hf_models.main(["--smoke", "--family", "qwen3_next", "--case", "decode32", "--variant", "stock,kda",
                              "--results-dir", str(tmp_path), "--cache-root", str(tmp_path / "caches"),
                              "--replay-rounds", "2"])
    assert not [r for r in records if r.get("error")], records
    assert [(r["variant"], r["cache"]) for r in records] == [("stock", "cold"), ("kda", "cold")] + \
        [("stock", "warm"), ("kda", "warm")] * 2
    kda = [r for r in records if r["variant"] == "kda"]
    assert kda[0]["pass_runs"] >= 1 and kda[0]["matches"]["causal_conv1d"] >= 1
    assert all(r["caches"].get("fx_hit") and not r["pass_runs"] for r in kda[1:])
    assert all(r["numerics"]["argmax_agree"] > 0.5 for r in records)
    assert "<!-- hf-section" in (tmp_path / "hf_models.md").read_text()


# --------------------------------------------------------------------------- benchmarks.hf_generate


def test_hf_generate_compiles_as_transformers_documents():
    """stock and kda: a static cache, and generate's own compile through ``CompileConfig``
    naming the backend; eager: generate as it comes."""
    from benchmarks import hf_generate

    eager = hf_generate.generate_kwargs("eager", new_tokens=5, smoke=False)
    assert "compile_config" not in eager and "cache_implementation" not in eager
    assert eager["min_new_tokens"] == eager["max_new_tokens"] == 5
    for variant, backend in (("stock", "inductor"), ("kda", "kda_inductor")):
        kw = hf_generate.generate_kwargs(variant, new_tokens=5, smoke=False)
        assert kw["cache_implementation"] == "static" and kw["compile_config"].backend == backend
        assert kw["compile_config"].mode == "reduce-overhead"


def test_hf_generate_eager_tokens_per_second():
    """The CPU path of one measurement (eager: no compile): tokens counted, times recorded."""
    from benchmarks import hf_generate

    r = hf_generate.run_one({"smoke": True, "device": "cpu", "family": "qwen3_next", "batch": 2, "prompt": 4,
                             "new_tokens": 3, "reps": 1, "variant": "eager", "profile": True})
    assert r["new_tokens"] == 3 and r["tokens_per_s"] == 2 * 3 / r["s"] and not r["compiled"]
    assert r["pass_graphs"] == 0 and r["rewrites"] == {}  # nothing compiled: our pass saw no graph
    # the prompt's forward alone (a one-token generate), and what is left a decoded token
    assert 0 < r["prefill_s"] and r["decode_ms_per_token"] == pytest.approx((r["s"] - r["prefill_s"]) / 2 * 1e3)
    assert r["prefill_recompiled"] is False
    # --profile: one more generate under the profiler; the host's operators account for part of its wall time
    prof = r["profile"]
    assert 0 < prof["host_ops_s"] and prof["gpu_busy_s"] == 0.0 and prof["wall_s"] > 0
    assert prof["top_host"] and any(op["op"].startswith("aten::") for op in prof["top_host"])
    rows = hf_generate.summarize([{**r, "family": "qwen3_next", "case": "batch 2", "variant": "eager", "cache": "cold"}])
    assert rows[0]["cold_tps"] == r["tokens_per_s"] and rows[0]["gpu_busy"] == 0.0  # CPU: no GPU time
    assert rows[0]["prefill_ms"] == r["prefill_s"] * 1e3 and rows[0]["cold_decode_ms"] == r["decode_ms_per_token"]


@pytest.mark.slow
def test_hf_generate_smoke_cold_and_warm(tmp_path):
    """generate() with stock and kda compiled by transformers itself, a process on an empty cache
    and one reading it; the same greedy tokens in every variant; a section of this commit."""
    from benchmarks import hf_generate

    records = hf_generate.main(["--smoke", "--family", "qwen3_next", "--batch", "1", "--reps", "1",
                                "--results-dir", str(tmp_path)])
    assert not [r for r in records if r.get("error")], records
    assert [(r["variant"], r["cache"]) for r in records] == [("eager", "cold"), ("stock", "cold"), ("stock", "warm"),
                                                             ("kda", "cold"), ("kda", "warm")]
    assert all(r["compiled"] for r in records if r["variant"] != "eager")
    # the record says whether our pass ran: kda's cold compile, not stock, not a warm cache's served code
    assert [r["pass_graphs"] > 0 for r in records] == [False, False, False, True, False]
    assert len({json_tokens(r) for r in records}) == 1
    # the one-token generates after the timed ones recompile nothing (the static cache is reused)
    assert not [r for r in records if r["prefill_recompiled"] or r["recompiles"]], records
    assert "<!-- hf-section" in (tmp_path / "hf_generate.md").read_text()


def test_hf_generate_merge_joins_the_calls_of_one_commit(tmp_path):
    """Two device calls' copies of hf_generate.json (one family each, the same commit) merge into one
    section of the target, rendered with what a generate was in those calls (their spec)."""
    from benchmarks import _hf_record, hf_generate

    state = {"source": "abc1234", "commit": "abc1234" + "0" * 33, "dirty": False}
    env = {"date": "2026-12-07 10:00 UTC", "gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11", "triton": "3.6"}
    files = []
    for i, fam in enumerate(("qwen3_next", "kimi_linear")):
        call = {"id": f"c{i}", "started": f"2026-12-07 10:0{i} UTC", "argv": ["--family", fam],
                "spec": {"prompt": 32, "new_tokens": 64, "reps": 3}}
        records = [{"family": fam, "case": "batch 1", "variant": v, "cache": "cold", "tokens_per_s": tps,
                    "call": call["id"], "source": "abc1234", "env": env} for v, tps in (("stock", 100.0), ("kda", 125.0))]
        sections: list = []
        _hf_record.merge_into(sections, state, env, call, records)
        path = tmp_path / f"call{i}" / "hf_generate.json"
        _hf_record.save_sections(path, sections)
        files.append(str(path))
    target = tmp_path / "results" / "hf_generate.json"
    merged = hf_generate.main(["--merge", str(target), *files])
    assert sorted({r["family"] for r in merged}) == ["kimi_linear", "qwen3_next"]
    sections = _hf_record.load_sections(target)
    assert len(sections) == 1 and len(sections[0]["calls"]) == 2
    md = (tmp_path / "results" / "hf_generate.md").read_text()
    assert "64 new greedy tokens" in md and md.count("| 1.250 |") == 2, md


def json_tokens(record):
    return str(record["tokens"])


# --------------------------------------------------------------------------- benchmarks.stock_lottery


def test_stock_lottery_row_names_the_costliest_autotuned_kernel_and_its_choice():
    """A compile's row: the autotuned kernel whose configs the autotuner saw take longest, the
    config it chose (the smallest time it saw), what it saw and the re-timed medians."""
    from benchmarks import stock_lottery

    record = {"compile": 1, "step_us": 500.0, "autotuned": [
        {"kernel": "triton_poi_small", "seen_us": {"XBLOCK=128 w4 s1": 2.0}, "again_us": {"XBLOCK=128 w4 s1": [2.0]}},
        {"kernel": "triton_red_fused_loop", "seen_us": {"R0_BLOCK=64 w8 s1": 700.0, "R0_BLOCK=8 w2 s1": 210.0},
         "again_us": {"R0_BLOCK=64 w8 s1": [220.0, 230.0, 225.0], "R0_BLOCK=8 w2 s1": [215.0, 212.0, 214.0]}}]}
    row = stock_lottery.row_of(record)
    assert row["kernel"] == "triton_red_fused_loop" and row["chosen"] == "R0_BLOCK=8 w2 s1"
    assert row["seen"] == "R0_BLOCK=64 w8 s1: 700.0; R0_BLOCK=8 w2 s1: 210.0"
    assert row["again"] == "R0_BLOCK=64 w8 s1: 225.0; R0_BLOCK=8 w2 s1: 214.0"
    assert stock_lottery.row_of({"compile": 2, "autotuned": []})["kernel"] == "-"


@pytest.mark.slow
def test_stock_lottery_worker_compiles_the_step_on_cpu(tmp_path):
    """The worker on CPU (tiny dims): stock compiles transformers' step and times it; no Triton
    autotuning there."""
    from benchmarks import stock_lottery

    record = stock_lottery.worker({"smoke": True, "batch": 2, "tokens": 1, "seed": 0})
    assert record["step_us"] > 0 and record["compile_s"] > 0 and record["autotuned"] == []


def test_hf_generate_parallel_runs_warm_after_cold(tmp_path, monkeypatch):
    """``hf_generate --jobs 3``: processes overlap, each variant's warm process starts after its
    cold one finished (it reads that cache), every process is recorded once with its cache
    state, and they share one GPU lock file."""
    import threading
    import time as _time

    from benchmarks import hf_generate

    finished, specs, live, peak = set(), [], set(), []
    guard = threading.Lock()

    def fake(spec, env, timeout):
        key = (spec["batch"], spec["variant"], env["TORCHINDUCTOR_CACHE_DIR"])
        with guard:
            warm = key in finished
            live.add(id(spec))
            peak.append(len(live))
            specs.append((spec, warm))
        _time.sleep(0.05)
        with guard:
            live.discard(id(spec))
            finished.add(key)
        return {"tokens_per_s": 10.0, "first_s": 1.0, "warm_seen": warm}

    monkeypatch.setattr(hf_generate, "_spawn", fake)
    records = hf_generate.main(["--smoke", "--family", "qwen3_next", "--batch", "1", "--batch", "2", "--jobs", "3",
                                "--results-dir", str(tmp_path)])
    assert sorted((r["case"], r["variant"], r["cache"]) for r in records) == sorted(
        (f"batch {b}", v, c) for b in (1, 2) for v, c in (("eager", "cold"), ("stock", "cold"), ("stock", "warm"),
                                                          ("kda", "cold"), ("kda", "warm")))
    assert all(r["warm_seen"] == (r["cache"] == "warm") for r in records)
    assert max(peak) > 1 and len({s["gpu_lock"] for s, _ in specs}) == 1


def test_gdn_chunk_registers():
    """``benchmarks/gdn_chunk_registers.py``: FAST's three launches recorded from the launcher and
    compiled for sm_90 as the run time specializes them (no GPU): one line each, with registers, stack
    bytes and barriers; an unknown label is an error."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = BENCHMARKS / "gdn_chunk_registers.py"
    proc = subprocess.run([sys.executable, str(script), "--configs", "FAST"], capture_output=True, text=True,
                          env=env, timeout=900, cwd=BENCHMARKS.parent)
    if proc.returncode == 3:
        pytest.skip("this Triton cannot compile for CUDA here")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("FAST ")]
    assert [line.split()[1] for line in lines] == ["wu2_kernel", "scan2_kernel", "output2_kernel"], proc.stdout
    assert all(re.search(r"4 warps 2 stages: \d+ registers, \d+ B stack, \d+ B shared, \d+ bar.sync", line)
               for line in lines), proc.stdout
    bad = subprocess.run([sys.executable, str(script), "--configs", "no such"], capture_output=True, text=True,
                         env=env, timeout=300, cwd=BENCHMARKS.parent)
    assert bad.returncode != 0 and "unknown" in bad.stderr + bad.stdout


def test_hf_with_variant_bypasses_one_rule_in_its_process():
    """``kda@with-<rewrite>``: compiled as kda (its base), with that one rewrite's speed rule
    bypassed in the worker's process; an unknown name is an error naming the registry's."""
    from benchmarks import _hf_sched
    from kda_inductor.patterns import REWRITES

    assert _hf_sched.base_variant("kda@with-gqa_decode_attention@no-cudnn-sdp") == "kda"
    assert _hf_sched.modified("kda@with-gqa_decode_attention")
    assert "no rewrite 'nope'" in _hf_sched.apply_modifiers("kda@with-nope")
    cls, other = REWRITES["gqa_decode_attention"], REWRITES["gdn_chunk" if "gdn_chunk" in REWRITES else "causal_conv1d"]
    saved, other_rule = cls.__dict__.get("speed_rule"), other.speed_rule
    try:
        assert _hf_sched.apply_modifiers("kda@with-gqa_decode_attention") is None
        assert cls.speed_rule(None, None) is None and other.speed_rule is other_rule
    finally:
        if saved is None:
            del cls.speed_rule
        else:
            cls.speed_rule = saved


def test_hf_with_gdn_chunk_turns_the_prefill_dynamo_rules_on(monkeypatch):
    """``kda@with-gdn_chunk``: fla's chunk entry points and transformers' torch references traced as
    the op in that process (the Dynamo rules' ``*_RULE_MEASURED`` set), the rewrites' rules untouched."""
    from benchmarks import _hf_sched
    from kda_inductor import _dynamo_chunk

    flags = ("CHUNK_RULE_MEASURED", "KDA_CHUNK_RULE_MEASURED", "TORCH_CHUNK_RULE_MEASURED", "TORCH_KDA_RULE_MEASURED")
    for flag in flags:
        monkeypatch.setattr(_dynamo_chunk, flag, False)
    assert _hf_sched.base_variant("kda@with-gdn_chunk") == "kda"
    assert _hf_sched.base_variant("kda@no-fla@with-gdn_chunk") == "kda"
    assert _hf_sched.apply_modifiers("kda@with-gdn_chunk") is None
    assert all(getattr(_dynamo_chunk, flag) is True for flag in flags)
    assert "Dynamo rules: gdn_chunk" in _hf_sched.apply_modifiers("kda@with-nope")


def test_hf_prefill1024_is_a_prefill_case_outside_the_table():
    """``--case prefill1024`` (a speed rule's A / B at another size): a prefill of 1 x 1024 tokens with
    stock+fix proposed as for the table's prefill, not among the default cases."""
    from benchmarks import hf_models

    assert hf_models.case_label("prefill1024", smoke=False) == "prefill 1 x 1024"
    assert "prefill1024" in hf_models.CASES and "prefill1024" not in hf_models.TABLE_CASES
    family = hf_models.BY_NAME["qwen3_next"]
    assert hf_models.plan_variants(family, "prefill1024", None) == hf_models.plan_variants(family, "prefill", None)
    assert hf_models.STOCK_FIX in hf_models.plan_variants(family, "prefill1024", None)


def test_hf_table_recipe_plans_only_the_rewrite_that_matters_most():
    """``--recipe table``: one kda-no-<rewrite> a case, ``gdn_recurrent_step`` in decode and
    ``causal_conv1d`` in prefill (what the table reports); ``rounds`` one per rewrite that fired."""
    from benchmarks import hf_models

    family = hf_models.BY_NAME["qwen3_next"]
    fired = ["causal_conv1d", "gdn_recurrent_step", "gated_norm_merge"]
    assert hf_models.plan_variants(family, "decode32", fired, "table") == ["eager", "stock", "kda",
                                                                          "kda-no-gdn_recurrent_step"]
    assert hf_models.plan_variants(family, "prefill", None, "table")[-1] == "kda-no-causal_conv1d"
    assert len(hf_models.plan_variants(family, "decode32", fired)) == 6
    assert hf_models.plan_variants(family, "decode32", ["gated_norm_merge"], "table") == ["eager", "stock", "kda"]


def test_hf_plan_at_a_frozen_commit_plans_only_what_its_section_lacks():
    """``--plan --at COMMIT``: a variant with every compile of the recipe in that commit's section
    (a time, or killed at ``--compile-limit``) is not planned again; a case with nothing left is
    dropped; a commit with no section is an error."""
    from benchmarks import hf_models

    def rec(case, variant, n, **extra):
        return [{"family": "olmo_hybrid", "case": case, "variant": variant, "us": 1.0, **extra}] * n

    records = (rec("decode32", "eager", 1) + rec("decode32", "stock", 3) + rec("decode32", "kda", 1)
               + rec("decode128", "eager", 1) + rec("decode128", "stock", 3) + rec("decode128", "kda", 2)
               + rec("decode128", "kda-no-gdn_recurrent_step", 1)
               + rec("prefill", "stock", 3, us=None, compile_limit_s=400.0) + rec("prefill", "stock+fix", 2))
    sections = [{"commit": "abc123" + "0" * 34, "records": records}, {"commit": "f" * 40, "records": rec("prefill", "kda", 2)}]
    done = hf_models.measured_at(sections, "abc123", "table", 3)
    assert done == {("olmo_hybrid", "decode32"): {"eager", "stock"},
                    ("olmo_hybrid", "decode128"): {"eager", "stock", "kda", "kda-no-gdn_recurrent_step"},
                    ("olmo_hybrid", "prefill"): {"stock"}}
    rows, _ = hf_models.plan(sections, [hf_models.BY_NAME["olmo_hybrid"]], ["decode32", "decode128", "prefill"], 3,
                             480.0, recipe="table", jobs=6, done=done)
    planned = {r["case"]: list(r["per_variant_s"]) for r in rows}
    assert planned == {"decode32": ["kda", "kda-no-gdn_recurrent_step"],
                       "prefill": ["eager", "stock+fix", "kda", "kda-no-causal_conv1d"]}
    with pytest.raises(SystemExit, match="no section"):
        hf_models.measured_at(sections, "0123", "table", 3)
    rows, _ = hf_models.plan(sections, [hf_models.BY_NAME["deepseek_v32"], hf_models.BY_NAME["olmo_hybrid"]],
                             ["decode32", "decode128", "prefill"], 3, 480.0, recipe="table", jobs=6, done=done,
                             only=hf_models.TABLE_CASES_OF)  # the indexer family: decode 32 only
    assert sorted((r["family"], r["case"]) for r in rows) == [("deepseek_v32", "decode32"),
                                                              ("olmo_hybrid", "decode32"), ("olmo_hybrid", "prefill")]


def test_hf_a_compile_killed_past_the_limit_by_a_budget_counts_as_limited():
    """A harness before ``--compile-limit`` records a compile no user waits for through its budget
    + grace (``.ci/table``'s background item): killed after ``LIMITED_AT_S`` or more it is measured
    (as failed, at that many seconds) for the plan and the bar; killed sooner, a call ran out of
    time and the variant is planned again."""
    from benchmarks import hf_models

    def rec(variant, n, kill=None):
        extra = {"us": None, "error": f"killed after {kill} s (the run's budget + grace)"} if kill else {"us": 1.0}
        return [{"family": "kimi_linear", "case": "prefill", "variant": variant, **extra}] * n

    assert hf_models.limited_s(rec("stock", 1, 500)[0]) == 500.0
    assert hf_models.limited_s(rec("stock", 1, 167)[0]) is None and hf_models.limited_s(rec("stock", 1)[0]) is None
    sections = [{"commit": "a" * 40, "records": rec("stock", 3, 500) + rec("stock+fix", 3)}]
    assert hf_models.measured_at(sections, "aaa", "table", 3) == {("kimi_linear", "prefill"): {"stock", "stock+fix"}}
    sections = [{"commit": "a" * 40, "records": rec("stock", 3, 167) + rec("stock+fix", 3)}]
    assert hf_models.measured_at(sections, "aaa", "table", 3) == {("kimi_linear", "prefill"): {"stock+fix"}}
    row = next(r for r in hf_models.summarize(rec("stock", 3, 500)) if r["variant"] == "stock")
    assert row["limited_s"] == 500.0 and row["compiles"] == "0 (+3 failed)"


def test_hf_kda_no_variant_takes_a_trace_rule():
    """``kda-no-gdn_chunk``: kda with the prefill trace rule disabled (an A / B of a rule on by
    default), through the same ``disable`` option as a rewrite's; an unknown name is an error
    naming both lists."""
    from benchmarks import hf_models

    hf_models._check_variants(["kda", "kda-no-gdn_chunk", "kda-no-causal_conv1d"])
    assert hf_models._kda_options("kda-no-gdn_chunk", None) == {"kda": {"disable": ["gdn_chunk"]}}
    assert "kda-no-gdn_chunk" in hf_models.variants_for(["kda", "kda-no-gdn_chunk"], None)
    with pytest.raises(SystemExit, match="trace rule of"):
        hf_models._check_variants(["kda-no-nope"])


def test_hf_models_fp32_reference_child_uses_the_compiles_weights_without_fla(tmp_path):
    """The fp32 reference's child process (fla-core hidden there) loads this process's weights:
    its logits are the in-process reference's, bit for bit (CPU: the same torch code both ways);
    weights it cannot load leave no reference behind (the caller then computes it itself), and the
    child's error comes back as the reason (the record's ``reference_child``)."""
    pytest.importorskip("transformers")
    from benchmarks import hf_models

    built = hf_models.build(hf_models.BY_NAME["qwen3_next"], tiny=True, device="cpu", layers=hf_models.SMOKE_LAYERS)
    if built is None:
        pytest.skip("qwen3_next is not in this transformers")
    model, config = built
    with torch.no_grad():  # weights no fresh build has: the child must load them to match
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    spec = {"family": "qwen3_next", "case": "decode32", "smoke": True, "device": "cpu",
            "reference_path": str(tmp_path / "ref.pt")}
    assert hf_models._reference_child(spec, model) is None
    want = hf_models.reference_logits(model, config, "decode32", smoke=True, device="cpu")
    assert torch.equal(torch.load(tmp_path / "ref.pt"), want)
    other = hf_models.build(hf_models.BY_NAME["qwen3_5"], tiny=True, device="cpu", layers=hf_models.SMOKE_LAYERS)[0]
    spec["reference_path"] = str(tmp_path / "none.pt")
    why = hf_models._reference_child(spec, other)  # qwen3_5's weights into qwen3_next: strict load fails
    assert not (tmp_path / "none.pt").exists()
    assert why is not None and why.startswith("exit 1") and "state_dict" in why, why
