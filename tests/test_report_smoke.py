"""benchmarks/report.py on CPU: its code paths (rows, targets, markdown, JSON, plots, the time
limit, $OUT) with tiny sizes and fake timers; the numbers are not meaningful. The GPU run is
``python -m benchmarks.report`` (see .ci/gpu, stage report)."""

from __future__ import annotations

import importlib
import json
import time
import types
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
report = importlib.import_module("benchmarks.report")


def fake_timer(fn):
    fn()  # still runs (and so checks) what it times
    return 7.0


def test_rewrite_rows_and_files(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "SMOKE_SIZES", (12,))
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    payload = report.main(["--smoke", "--only", "gdn_spec_split", "--no-record"], timer=fake_timer)
    assert not payload["errors"], payload["errors"]
    (row,) = payload["rewrites"]
    assert row["rewrite"] == "gdn_spec_split" and row["kda_us"] == 7.0 and row["stock_over_kda"] == 1.0
    files = {p.name for p in (tmp_path / "out").iterdir()}
    assert {"report.md", "report.json", "report_rewrites.png"} <= files
    assert json.loads((tmp_path / "out" / "report.json").read_text())["rewrites"][0]["T"] == 12


def synthetic_payload():
    rows = []
    for T in (24, 20):
        for name, shape in (("gdn_spec_split", "gdn"), ("gdn_spec_split", "kda"), ("gated_norm_merge", "H=2 D=16"),
                            ("indexer_k_write", "LN+ue8m0, D=128"), ("indexer_k_write", report._bench("indexer_k_write").MODEL_SHAPE)):
            rows.append({"rewrite": name, "shape": shape, "T": T, "eager_us": 30.0, "stock_us": 20.0, "kda_us": 10.0,
                         "floor_us": 5.0, "peer_us": 12.0 if name == "gated_norm_merge" else None})
        rows.append({"rewrite": "indexer_k_gather", "shape": f"{T} tok step", "T": 3 * T, "eager_us": 30.0,
                     "stock_us": 20.0, "kda_us": 10.0})
    rows[4]["stock_us"] = None  # the model's write, which stock cannot compile: eager stands in
    rows[3]["kda_us"] = 1.0  # the write with its LayerNorm: not the model's region, never counted
    model = [{"step": "spec", "T": 24, "core": "torch", "eager_us": 900.0, "stock_us": 500.0, "kda_us": 420.0},
             {"step": "prefill", "T": 20, "core": "torch", "eager_us": 900.0, "stock_us": 500.0, "kda_us": 480.0}]
    return rows, model


def test_targets_count_every_region_of_a_step():
    rows, model = synthetic_payload()
    spec, prefill = report.targets(model, rows)
    # spec: two splits, two norms, the write (eager 30 where stock fails), the gather
    assert spec["sum_savings_us"] == 10 + 10 + 2 * 10 + 20 + 10 and spec["saved_us"] == 80
    assert spec["fraction"] == pytest.approx(80 / 70) and spec["meets_80pct"] == "yes"
    assert spec["region_share_before"] == pytest.approx((20 + 20 + 40 + 30 + 20) / 500)
    assert prefill["fraction"] == pytest.approx(20 / 60) and prefill["meets_80pct"] == "no"


def test_targets_count_only_the_rewrites_that_fired_in_the_step():
    """A step whose speed rules left a rewrite to Inductor (the prefill's one-sided split)
    counts neither its saving nor its region."""
    rows, model = synthetic_payload()
    model[1]["rewrites"] = {"indexer_k_write": 1, "indexer_k_gather": 1, "gated_norm_merge": 2}
    _, prefill = report.targets(model, rows)
    assert prefill["sum_savings_us"] == 2 * 10 + 10 + 10  # at T=20 stock has the write
    assert set(prefill["savings_by_rewrite_us"]) == {"gated_norm_merge x2", "indexer_k_write", "indexer_k_gather"}
    assert prefill["region_share_before"] == pytest.approx((40 + 20 + 20) / 500)


def test_fp8_step_counts_its_own_rewrite_and_its_evidence():
    """The FP8 step: its regions are those its compile with gated_norm_quant rewrote (the norm
    + quant rows of that rewrite's benchmark, not gated_norm_merge's), kda is kda+gnq, and the
    rewrite's saving in the step (kda-no-gnq minus kda+gnq) stands beside the isolated one."""
    rows, model = synthetic_payload()
    gnq = report._bench("gated_norm_quant")
    rows.append({"rewrite": "gated_norm_quant", "shape": gnq.MODEL_SHAPE, "T": 24, "eager_us": 30.0,
                 "stock_us": 20.0, "kda_us": 10.0, "kda_no_us": 14.0})
    fired = {"gdn_spec_split": 2, "indexer_k_write": 1, "indexer_k_gather": 1}
    fp8 = {"step": "spec fp8", "T": 24, "core": "torch", "eager_us": 900.0, "stock_us": 500.0, "kda_us": 480.0,
           "kda_gnq_us": 460.0, "kda_no_gnq_us": 480.0, "rewrites": {**fired, "gated_norm_merge": 2},
           "rewrites_gnq": {**fired, "gated_norm_quant": 2}}
    (t,) = report.targets([fp8], rows)
    assert set(t["savings_by_rewrite_us"]) == {"gdn_spec_split (gdn)", "gdn_spec_split (kda)", "indexer_k_write",
                                               "indexer_k_gather", "gated_norm_quant x2"}
    assert t["savings_by_rewrite_us"]["gated_norm_quant x2"] == 20 and t["saved_us"] == 40
    assert t["gnq_in_step_us"] == 20 and t["gnq_isolated_us"] == 8
    assert t["region_share_after"] == pytest.approx((10 + 10 + 20 + 10 + 10) / 460)


def test_markdown_and_plots(tmp_path):
    rows, model = synthetic_payload()
    payload = {"env": {"date": "today", "gpu": None, "torch": "x", "triton": "y"}, "fla": None, "notes": "n",
               "rewrites": rows, "model": model, "targets": report.targets(model, rows), "errors": ["e1"]}
    written = report.write_outputs(payload, [tmp_path / "a", tmp_path / "b"])
    names = sorted(p.name for p in written if p.parent == tmp_path / "b")
    assert names == sorted(report.FILES)
    md = (tmp_path / "a" / "report.md").read_text()
    assert "| gated_norm_merge |" in md and "## Targets" in md and "- e1" in md and "rewritten share" in md
    assert (tmp_path / "a" / "report_model.png").stat().st_size > 10_000


def test_time_limit_stops_and_writes_what_ran(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "SMOKE_SIZES", (12, 24, 36))

    def slow_timer(fn):
        time.sleep(3)
        return 1.0

    t0 = time.perf_counter()
    payload = report.main(["--smoke", "--only", "gdn_spec_split", "--no-record", "--out", str(tmp_path),
                           "--timeout", "4"], timer=slow_timer)
    assert time.perf_counter() - t0 < 60
    assert any("stopped" in e for e in payload["errors"])
    assert (tmp_path / "report.json").exists()


def test_bad_arguments():
    with pytest.raises(SystemExit):
        report.parse_args(["--only", "nonsense"])
    with pytest.raises(SystemExit):
        report.parse_args(["--steps", "decode"])


def test_model_steps_timed_each_with_its_own_write_mode():
    """Stock runs the cache write eagerly where it cannot compile it; switching the model's
    write mode re-traces a compiled step, so each variant must be timed in its own mode (the
    kda step was once timed re-traced with the eager write), and the model left as it was."""
    model = types.SimpleNamespace(attn=types.SimpleNamespace(eager_write=False, kv_cache=torch.arange(4.0)))
    seen = {}

    def step(label):
        def run():
            seen[label] = model.attn.eager_write
            model.attn.kv_cache.add_(1)  # a step writes the cache
        return run

    s = report.Settings(report.parse_args(["--smoke"]), timer=lambda fn: (fn(), 3.0)[1])
    out = s.model_times(model, {"stock_us": (step("stock_us"), True), "kda_us": (step("kda_us"), False)})
    assert seen == {"stock_us": True, "kda_us": False} and out == {"stock_us": 3.0, "kda_us": 3.0}
    assert model.attn.eager_write is False and torch.equal(model.attn.kv_cache, torch.arange(4.0))
