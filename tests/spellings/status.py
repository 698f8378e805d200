"""Status of the spelling corpus: ``python -m tests.spellings.status [name-substring ...]``.

Runs each case (as ``test_corpus.py`` does) and prints one line per case, pass or fail, and
for failures the reason: the match counts and the closest misses the pass recorded
(``rewrite: location: check``), or the exception.
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("TRITON_INTERPRET", "1")

from tests.spellings._corpus import all_cases, check_case  # noqa: E402


def main(argv: list[str]) -> int:
    cases = all_cases()
    if argv:
        cases = [c for c in cases if any(a in c.name for a in argv)]
    failed = 0
    start = time.time()
    for case in cases:
        t = time.time()
        try:
            check_case(case)
            status, detail = "pass", ""
        except Exception as e:  # noqa: BLE001 - a status report
            failed += 1
            status = "FAIL"
            detail = f"{type(e).__name__}: {e}".strip()
        print(f"{status}  {case.name}  ({time.time() - t:.1f} s)  expect {case.expect or 'no match'}", flush=True)
        if detail:
            print("      " + "\n      ".join(detail.splitlines()[:12]), flush=True)
    print(f"{len(cases) - failed}/{len(cases)} pass, {time.time() - start:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
