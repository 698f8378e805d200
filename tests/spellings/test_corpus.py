"""The spelling corpus: every case compiles with the backend, matches exactly as expected and
computes what eager computes (see ``_corpus.py`` for the comparisons, ``cases_*.py`` for the
cases and their sources). ``python -m tests.spellings.status`` prints which cases pass now
and, for the others, the closest misses the pass recorded.
"""

from __future__ import annotations

import pytest

from tests.spellings._corpus import all_cases, check_case

CORPUS = all_cases()


def test_names_are_unique():
    names = [case.name for case in CORPUS]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


@pytest.mark.parametrize("case", CORPUS, ids=lambda case: case.name)
def test_spelling(case):
    check_case(case, seed=0)
