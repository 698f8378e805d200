"""Live progress for long compiles: on a terminal only, and it follows our pass's graphs."""

from __future__ import annotations

import io

from kda_inductor import pass_manager, progress
from kda_inductor.pass_manager import PassRecord


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_quiet_when_piped_or_asked(capsys, monkeypatch):
    assert not progress.enabled(io.StringIO())
    assert progress.enabled(_Tty())
    monkeypatch.setenv("NO_PROGRESS", "1")
    assert not progress.enabled(_Tty())
    with progress.compile_progress("demo") as step:  # stderr is captured: not a terminal
        step("compiling")
    assert capsys.readouterr() == ("", "")


def test_shown_progress_follows_the_pass():
    before = list(pass_manager._observers)
    with progress.compile_progress("demo", show=True) as step:
        step("compiling")
        assert len(pass_manager._observers) == len(before) + 1
        pass_manager._observers[-1](PassRecord(matches={"indexer_k_gather": 1, "gdn_spec_split": 0}))
    assert pass_manager._observers == before
    assert progress._graph_summary(0, PassRecord(matches={"indexer_k_gather": 1})) == (
        "graph 0: our pass done (indexer_k_gather x1); Inductor generates code")
    assert "traced with grad" in progress._graph_summary(1, PassRecord(skipped="traced with grad enabled"))
