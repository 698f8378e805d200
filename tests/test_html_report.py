"""The HTML report (``graph-diff --html``): one self-contained page, checked in a real browser.

The browser test renders the page in headless Chromium (Debian's ``chromium``; ``.ci/run``
installs it) at 1280 px: no horizontal overflow with every fold opened, the rewrite table
visible in the first screen. Its screenshot is kept in ``out/test-artifacts/`` (gitignored).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

import kda_inductor
from kda_inductor.report_html import page
from tests import graph_targets

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "out" / "test-artifacts"


def _two_graphs():
    """A gather that matches, a graph break, then an interleaved-layout gather that does not."""
    fn_ok, args_ok = graph_targets.build()
    fn_bad, args_bad, _ = graph_targets.interleaved()

    def fn(cache, table, cu):
        a = fn_ok(cache, table, cu)
        torch._dynamo.graph_break()
        return a, fn_bad(cache, table, cu)

    return fn, args_ok


@pytest.fixture(scope="module")
def report_page():
    fn, args = _two_graphs()
    with torch.inference_mode():
        report = kda_inductor.Explainer(options={"kda": {"force": True}})(fn, *args)
    return report, page(report, title="kda_inductor report: two graphs", notes=["a test page"])


def test_page_structure(report_page):
    report, text = report_page
    assert report.matches["indexer_k_gather"] == 1 and len(report.graphs) == 2
    assert "<title>kda_inductor report: two graphs</title>" in text
    assert "<script" not in text and "Empty File" not in text and "difflib" not in text
    # the rewrite table comes first, then the regions, misses and obstacles
    order = [text.index(s) for s in ('id="rewrites"', "What changed", "Not rewritten", "Graph breaks: 1",
                                     "Frames that fell back to eager: 0", "Cudagraph skips: 0")]
    assert order == sorted(order)
    table = text[text.index('id="rewrites"'):text.index("</table>")]
    assert re.search(r"<code>indexer_k_gather</code></td><td class=num>1</td><td class=num>22</td>", table)
    assert "aten.searchsorted" in table and "kda.indexer_k_gather" in table
    # the region only: the gather's lines, unchanged context folded, the rest of the graph left out
    region = text[text.index("What changed"):text.index("Not rewritten")]
    assert '<div class="l add">indexer_k_gather_0 = kda.indexer_k_gather.default(in0, in2, in1, 78, 128)' in region
    assert '<div class="l del">searchsorted_0 = aten.searchsorted.Tensor(in1, iota_0, right=True)' in region
    # misses at the user's line; the graph break with its reason
    misses = text[text.index("Not rewritten"):text.index("Graph breaks")]
    assert re.search(r"<code>indexer_k_gather</code>: <code>[^<]*graph_targets\.py:\d+</code>: not rewritten: "
                     r"indices differ", misses)
    assert "test_html_report.py:" in text[text.index("Graph breaks"):]  # where the break happened
    assert len(text) < 40_000, len(text)  # folded, not the whole graph twice


def test_region_folds_long_unchanged_runs():
    from kda_inductor.diff import NodeRow
    from kda_inductor.report_html import region_diff

    def row(name, target="aten.add.Tensor", inputs=()):
        return NodeRow(name, "call_function", target, ", ".join(f"%{i}" for i in inputs), "f32[4]", tuple(inputs))

    chain = [NodeRow("x", "placeholder", "x", "", "f32[4]", ())] + [row(f"a{i}", inputs=("x",)) for i in range(30)]
    before = [*chain, row("old", "aten.mul.Tensor", ("x",)), *[row(f"b{i}", inputs=("x",)) for i in range(30)],
              row("user", "aten.neg.default", ("old",))]
    after = [*chain, row("fused", "kda.fused.default", ("x",)), *[row(f"b{i}", inputs=("x",)) for i in range(30)],
             row("user", "aten.neg.default", ("fused",))]
    html = region_diff(before, after, ["old"], ["fused"])
    assert html.count('class="l del"') == 2 and html.count('class="l add"') == 2  # the node and its rerouted user
    assert "<details><summary>26 unchanged lines</summary>" in html
    assert "lines 1-29 of the graph: not shown" in html
    assert region_diff(before, after, ["nothing"], ["nothing_either"]) == ""


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    return None


def _render(browser: str, url: str, *extra: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as profile:
        cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               f"--user-data-dir={profile}", "--hide-scrollbars", *extra, url]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)


_MEASURE = """<script>
for (const d of document.querySelectorAll("details")) d.open = true;
const t = document.getElementById("rewrites").getBoundingClientRect();
document.body.dataset.measured = [document.documentElement.scrollWidth, document.documentElement.clientWidth,
  t.top, t.bottom, t.left, t.right].join(",");
</script></body>"""


def test_page_fits_1280px_in_chromium(report_page):
    browser = _chromium()
    if browser is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: .ci/run installs Debian's chromium package")
        pytest.skip("headless Chromium not installed (apt-get install chromium); CI installs it")
    _, text = report_page
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page_file = ARTIFACTS / "html_report.html"
    page_file.write_text(text, encoding="utf-8")
    probe = ARTIFACTS / "html_report_measure.html"
    probe.write_text(text.replace("</body>", _MEASURE, 1), encoding="utf-8")

    dom = _render(browser, probe.as_uri(), "--window-size=1280,900", "--virtual-time-budget=2000",
                  "--dump-dom").stdout
    m = re.search(r'data-measured="([^"]+)"', dom)
    assert m, dom[-2000:]
    scroll_w, client_w, top, bottom, left, right = (float(v) for v in m.group(1).split(","))
    assert client_w == 1280, client_w
    assert scroll_w <= client_w, f"horizontal overflow: content {scroll_w} px wide in a {client_w} px window"
    assert 0 <= top < 900 and bottom > top and left >= 0 and right <= client_w, (top, bottom, left, right)

    shot = ARTIFACTS / "html_report_1280.png"
    shot.unlink(missing_ok=True)
    _render(browser, page_file.as_uri(), "--window-size=1280,1600", f"--screenshot={shot}")
    assert shot.stat().st_size > 10_000  # kept as the test's artifact
