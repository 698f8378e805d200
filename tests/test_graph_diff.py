"""The graph diff (`explain(...).diff`, `kda-inductor graph-diff`) and TORCH_TRACE artifacts."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import expecttest
import pytest
import torch

import kda_inductor
from kda_inductor import cli
from tests import graph_targets

ROOT = Path(__file__).resolve().parents[1]
TARGETS = str(Path(__file__).with_name("graph_targets.py"))
FORCED = kda_inductor.Explainer(options={"kda": {"force": True}})
"""``explain`` with the speed rules off (``--force``): on CPU they leave these small gathers to
Inductor, with nothing to diff."""


class Snapshots(expecttest.TestCase):
    """Normalized reports (op names and rewrite tables, no node names): same on torch 2.9-2.14."""

    def test_example_file(self):
        fn, args, kwargs = cli.load_target(str(ROOT / "examples" / "indexer_k_gather_demo.py"))
        report = FORCED(fn, *args, **kwargs)
        self.assertExpectedInline(report.normalized(), """\
graph 0
rewrite           matches  removed  added
indexer_k_gather        1       22      3
                    - aten.add x3, aten.div, aten.index x4, aten.mul x2, aten.remainder,
                      aten.reshape, aten.searchsorted, aten.sub x2, aten.unsqueeze x4, prims.iota x3
                    + getitem x2, kda.indexer_k_gather
graph breaks: 0; eager frames: []; cudagraph skips: 0""")

    def test_interleaved_layout_misses(self):
        fn, args, _ = graph_targets.interleaved()
        report = kda_inductor.explain(fn, *args)
        checks = sorted({m.check for g in report.graphs for m in g.misses["indexer_k_gather"]})
        self.assertExpectedInline("\n".join([report.normalized(), *checks]), """\
graph 0
rewrite  matches  removed  added
graph breaks: 0; eager frames: []; cudagraph skips: 0
indices differ from block_table[req, pos // 16] and (pos % 16) * 128 + j (another layout or block size)""")


def test_report_diff_names_are_readable_and_shared():
    fn, args = graph_targets.build()
    diff = FORCED(fn, *args).diff
    assert "=== graph 0 ===" in diff and re.search(r"indexer_k_gather +1 ", diff)
    # nodes the pass kept have the same readable name on both sides; new ones get their own
    assert "\n in2 = input" in diff and "\n+indexer_k_gather_0 = kda.indexer_k_gather.default(in0, " in diff
    assert "\n-searchsorted_0 = aten.searchsorted.Tensor(in1, iota_0, right=True)" in diff


def _run_cli(capsys, *argv):
    assert cli.main(["graph-diff", *argv]) == 0
    return capsys.readouterr().out


def test_cli_plain_when_piped_and_colored_on_request(capsys, tmp_path):
    out = _run_cli(capsys, TARGETS, "--force")
    assert "\x1b[" not in out  # captured output is not a terminal
    assert re.search(r"indexer_k_gather +1 ", out) and "+indexer_k_gather_0 = kda.indexer_k_gather" in out
    assert "graph breaks: 0" in out and "frames that fell back to eager: 0" in out
    colored = _run_cli(capsys, TARGETS, "--force", "--color", "always")
    assert "\x1b[32m+indexer_k_gather_0" in colored and "\x1b[31m-searchsorted_0" in colored


def test_cli_html_and_rewrite_filter(capsys, tmp_path):
    page = tmp_path / "diff.html"
    out = _run_cli(capsys, f"{TARGETS}:build", "--rewrite", "indexer_k_gather", "--force", "--html", str(page))
    assert f"wrote {page}" in out
    text = page.read_text()
    assert f"<title>kda_inductor report: {TARGETS}:build</title>" in text
    assert 'id="rewrites"' in text and "kda.indexer_k_gather.default" in text  # the report itself: test_html_report
    with pytest.raises(SystemExit):
        cli.main(["graph-diff", TARGETS, "--rewrite", "no_such_rewrite"])
    assert "invalid choice" in capsys.readouterr().err


def test_cli_explain_misses(capsys):
    out = _run_cli(capsys, f"{TARGETS}:interleaved", "--explain-misses")
    assert "indexer_k_gather: no match; closest candidates:" in out
    # at the user's line, with its code and the node in the diff
    assert re.search(r"\n  \S*graph_targets\.py:\d+: not rewritten: indices differ .*another layout or "
                     r"block size\) \(node index_\d+\)\n      \S", out), out


def test_cli_mode_with_rewrite(capsys):
    """--mode and --rewrite together: the mode is spelled as the Inductor options it stands for."""
    out = _run_cli(capsys, TARGETS, "--rewrite", "indexer_k_gather", "--mode", "reduce-overhead", "--force")
    assert "mode=reduce-overhead, only indexer_k_gather, force" in out
    assert re.search(r"indexer_k_gather +1 ", out)
    assert "cudagraph skips: 1" in out  # triton.cudagraphs was on (and there is no CUDA work on CPU)


def test_cli_inference_mode_by_default_and_grad_on_request(capsys):
    out = _run_cli(capsys, f"{TARGETS}:with_parameter", "--force")
    assert "run under torch.inference_mode() (--grad keeps grad)" in out
    assert re.search(r"indexer_k_gather +1 ", out) and "traced with grad enabled" not in out
    out = _run_cli(capsys, f"{TARGETS}:with_parameter", "--force", "--grad", "--explain-misses")
    assert "run under grad mode on (--grad)" in out and re.search(r"indexer_k_gather +0 ", out)
    assert "\nnot rewritten: this graph was traced with grad enabled" in out


def test_cli_lists_builders_when_build_is_missing():
    with pytest.raises(SystemExit, match=r"has no function build\(\); its functions that take no arguments: "
                                         r"build_gdn, build_kda \(e.g. kda-inductor graph-diff "
                                         r"\S*gdn_layers.py:build_gdn\)"):
        cli.load_target(str(ROOT / "examples" / "gdn_layers.py"))


def test_help_is_plain_text(capsys):
    with pytest.raises(SystemExit):
        cli.main(["graph-diff", "--help"])
    text = capsys.readouterr().out
    assert cli.main(["--help"]) == 0
    text += capsys.readouterr().out
    assert "--grad" in text and "inference_mode" in text
    assert "``" not in text and ":func:" not in text


def test_listing_names_functionalized_ops_and_open_slices():
    import torch.fx as fx
    from torch._higher_order_ops.auto_functionalize import auto_functionalized

    import kda_inductor.lowerings  # noqa: F401  (registers the kda ops)
    from kda_inductor.diff import listing, op_counts, readable_names, snapshot

    g = fx.Graph()
    cache, k, slots = (g.placeholder(n) for n in ("cache", "k", "slots"))
    sl = g.call_function(torch.ops.aten.slice.Tensor, (k, 1, 64, 2**63 - 1))
    w = g.call_function(auto_functionalized, (torch.ops.kda.indexer_k_write.default,),
                        {"kv_cache": cache, "k": sl, "slot_mapping": slots})
    g.output((w,))
    rows = snapshot(g)
    text = listing(rows, readable_names(rows, rows))
    assert "slice_0 = aten.slice.Tensor(in1, 1, 64, None)" in text
    assert ("indexer_k_write_0 = kda.indexer_k_write.default(kv_cache=in0, k=slice_0, slot_mapping=in2)"
            "  # in place on in0") in text
    assert op_counts(rows) == {"aten.slice": 1, "input": 3, "kda.indexer_k_write": 1, "output": 1}


def test_cli_module_function_target(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = _run_cli(capsys, "tests.graph_targets:build", "--explain-misses")
    assert re.search(r"indexer_k_gather +0 ", out) and "left to Inductor: on cpu" in out  # the speed rules on
    assert re.search(r"indexer_k_gather +1 ", _run_cli(capsys, "tests.graph_targets:build", "--force"))


def test_cli_bad_target_is_a_clear_error(tmp_path):
    (tmp_path / "t.py").write_text("def build():\n    return 3\n")
    with pytest.raises(SystemExit, match=r"must return \(fn, args\)"):
        cli.main(["graph-diff", str(tmp_path / "t.py")])
    with pytest.raises(SystemExit, match="has no function nope"):
        cli.main(["graph-diff", f"{tmp_path / 't.py'}:nope"])


def test_cli_says_the_speed_rules_left_the_code_to_inductor(capsys):
    out = _run_cli(capsys, TARGETS)  # on CPU the rule leaves this small gather to Inductor
    assert re.search(r"indexer_k_gather +0 ", out)
    assert ("(our pass changed nothing: the speed rules left these matches to Inductor, whose code is faster "
            "here; --force rewrites them anyway)") in out
    assert re.search(r"\n  indexer_k_gather: \S*reference\.py:\d+: left to Inductor: on cpu the op is slower", out), out


@pytest.mark.parametrize("files, target, message", [
    ({"t.py": "def helper():\n    raise ValueError('no weights at /x')\n\ndef build():\n    return helper()\n"},
     "t.py", r"^graph-diff: build\(\) raised ValueError: no weights at /x\n  at \S*t\.py:2 in helper: "
             r"raise ValueError\('no weights at /x'\)\n  \(--traceback shows the whole traceback\)$"),
    ({"t.py": "import no_such_dependency\n"},
     "t.py", r"^graph-diff: importing \S*t\.py raised ModuleNotFoundError: No module named 'no_such_dependency'\n"
             r"  at \S*t\.py:1 in <module>: import no_such_dependency\n"),
    ({"t.py": "def build(n, device='cpu'):\n    pass\n\ndef make_small():\n    pass\n"},
     "t.py", r"^graph-diff: build\(n, device='cpu'\) needs arguments; TARGET names a function that takes none "
             r"\(\S*t\.py's functions that take none: make_small\)"),
    ({"pkg_t/__init__.py": "", "pkg_t/m.py": "x = 1 / 0\n"},
     "pkg_t.m:build", r"^graph-diff: importing pkg_t.m raised ZeroDivisionError: division by zero\n  at \S*m\.py:1"),
    ({}, "no_such_pkg_t.models:build", r"^graph-diff: no module named 'no_such_pkg_t' \(TARGET no_such_pkg_t"),
])
def test_cli_load_errors_are_short_messages_without_header(files, target, message, tmp_path, capsys, monkeypatch):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    with pytest.raises(SystemExit) as exited:
        cli.main(["graph-diff", str(tmp_path / target) if target.endswith(".py") else target])
    assert re.search(message, str(exited.value.code)), exited.value.code
    assert "Traceback" not in str(exited.value.code) and len(str(exited.value.code).splitlines()) <= 3
    assert capsys.readouterr().out == ""  # no "compiled with backend=..." header: nothing compiled


def test_cli_load_error_exit_status_and_traceback_on_request(tmp_path):
    (tmp_path / "t.py").write_text("def build():\n    raise RuntimeError('boom')\n")
    cmd = [sys.executable, "-m", "kda_inductor.cli", "graph-diff", str(tmp_path / "t.py")]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("graph-diff: build() raised RuntimeError: boom\n") and "Traceback" not in done.stderr
    done = subprocess.run([*cmd, "--traceback"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "Traceback (most recent call last)" in done.stderr, done.stderr


ARTIFACTS = ("kda_inductor_post_grad_before", "kda_inductor_post_grad_after", "kda_inductor_rewrites",
             "kda_inductor_graph_diff")


@pytest.fixture(scope="module")
def torch_trace(tmp_path_factory):
    """A TORCH_TRACE folder of one forced compile of the gather (one log file)."""
    folder = tmp_path_factory.mktemp("trace")
    code = (
        "import sys; sys.path.insert(0, %r)\n"
        "import torch; from tests import graph_targets\n"
        "fn, args = graph_targets.build()\n"
        "torch._inductor.config.force_disable_caches = True\n"
        "torch.compile(fn, backend='kda_inductor')(*args)\n" % str(ROOT)
    )
    env = {**os.environ, "TORCH_TRACE": str(folder)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=ROOT, timeout=300)
    return folder


def test_torch_trace_artifacts(torch_trace):
    """Under TORCH_TRACE our before/after graphs land next to Inductor's, for tlparse."""
    logs = "".join(p.read_text() for p in torch_trace.iterdir())
    for name in ARTIFACTS:
        assert f'"name": "{name}"' in logs, name


TLPARSE = shutil.which("tlparse", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")


@pytest.mark.skipif(TLPARSE is None, reason="tlparse is not installed (pip install tlparse)")
def test_tlparse_shows_our_artifacts(torch_trace, tmp_path):
    """The README's command: tlparse on the log file writes a page per artifact, ours included."""
    (log,) = torch_trace.glob("*.log")
    subprocess.run([TLPARSE, str(log), "-o", str(tmp_path / "html"), "--no-browser"], check=True, timeout=300,
                   capture_output=True)
    pages = {p.name for p in (tmp_path / "html").rglob("*")}
    for name in ARTIFACTS:
        assert any(page.startswith(f"{name}_") for page in pages), (name, sorted(pages))
    assert "index.html" in pages


def test_cli_version_prints_the_version_and_exits_0(capsys):
    """``kda-inductor --version``: the installed version, exit 0 (it used to print the help and exit 2)."""
    from kda_inductor import cli

    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("kda-inductor ")
