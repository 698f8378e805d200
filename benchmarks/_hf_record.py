"""One run, one commit: where ``benchmarks.hf_models`` keeps its measurements.

``hf_models.json`` holds *sections*; a section is one run of the harness at one source state
(a commit, clean, or the same dirty tree) on one environment (GPU, torch, triton, transformers,
fla-core). A stage split over several device calls adds each call's records to the section of
its source state and environment: calls at another commit, or on a tree whose files differ from
it, make a section of their own. ``hf_models.md`` shows each section between markers, rendered
from the JSON; text outside the markers (older sections, notes) is kept as written.

The source state (``source_state``):
- a git checkout: ``git rev-parse HEAD``, and dirty when ``git status`` lists a change to a tracked
  file outside ``benchmarks/results/`` (what the runs write), or an untracked ``.py`` under
  ``CHECKED_DIRS`` (as for a stamp);
- no ``.git`` (the device tool sends a copy of the working tree): the stamp that
  ``python -m benchmarks.hf_models --stamp`` wrote next to the checkout (``.hf_stamp.json``: the
  commit and the git blob hash of every file in it), checked file by file against the tree the
  harness runs in; a file that differs, is missing, or a ``.py`` the commit lacks makes it dirty;
- neither: commit ``unknown``.
A dirty state's id carries a hash of the differing files, so two calls on the same dirty tree
still share a section, and the heading says ``dirty``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any, Iterable

ROOT = Path(__file__).resolve().parent.parent
STAMP = ".hf_stamp.json"
RESULTS_PREFIX = "benchmarks/results/"
"""Files the runs themselves write: never make a tree dirty."""
CHECKED_DIRS = ("kda_inductor/", "benchmarks/", "integration/")
"""Where a ``.py`` file the commit lacks makes a stamped tree dirty (code a run may import)."""
BEGIN, END = "<!-- hf-section {} -->", "<!-- /hf-section -->"


# --------------------------------------------------------------------------- the source state


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def blob_hash(data: bytes) -> str:
    """Git's object id of a file with these bytes."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _digest(paths: Iterable[str], root: Path) -> str:
    """A short hash of these files' names and bytes (missing files hash as missing)."""
    h = hashlib.sha256()
    for rel in sorted(paths):
        p = root / rel
        h.update(rel.encode() + b"\0" + (p.read_bytes() if p.is_file() else b"<missing>") + b"\0")
    return h.hexdigest()[:12]


def _state(commit: str, changed: list[str], how: str, root: Path) -> dict[str, Any]:
    dirty = bool(changed)
    source = commit if not dirty else f"{commit}+dirty-{_digest(changed, root)}"
    return {"commit": commit, "dirty": dirty, "source": source, "how": how, "changed": sorted(changed)[:20]}


def source_state(root: Path = ROOT) -> dict[str, Any]:
    """``{"commit", "dirty", "source" (the section key), "how", "changed"}`` of the tree at ``root``:
    the stamp's commit where every file matches the stamp (the device tool's copy carries a stale
    ``.git``, whose HEAD is an older commit than its files), else git's, else the stamp's (dirty)."""
    stamp = root / STAMP
    stamped = None
    if stamp.is_file():
        data = json.loads(stamp.read_text())
        stamped = _state(data["commit"], stamp_changes(data["files"], root), "stamp", root)
        if not stamped["dirty"]:
            return stamped
    head = _git(root, "rev-parse", "HEAD") if (root / ".git").exists() else None
    if head:
        status = _git(root, "status", "--porcelain", "--untracked-files=all") or ""
        changed = [p for p in (_status_path(line) for line in status.splitlines() if line.strip()) if p]
        return _state(head.strip(), changed, "git", root)
    return stamped or {"commit": "unknown", "dirty": None, "source": "unknown", "how": "none", "changed": []}


def _status_path(line: str) -> str | None:
    """The path of one ``git status --porcelain`` line that makes the tree dirty, else None: a change
    to a tracked file (outside ``benchmarks/results/``), or an untracked ``.py`` under ``CHECKED_DIRS``
    (code a run may import; untracked notes and scripts elsewhere, such as the device tool's carried
    folders, do not change what the harness measures: the stamp's rule)."""
    path = line[3:].split(" -> ")[-1].strip('"')
    if path.startswith(RESULTS_PREFIX) or path == STAMP:
        return None
    if line.startswith("??") and not (path.endswith(".py") and path.startswith(CHECKED_DIRS)):
        return None
    return path


def stamp_changes(files: dict[str, str], root: Path) -> list[str]:
    """The files under ``root`` that differ from the stamp's (``{path: blob hash}``): changed or
    missing ones, and ``.py`` files under ``CHECKED_DIRS`` that the stamp lacks."""
    changed = []
    for rel, blob in files.items():
        if rel.startswith(RESULTS_PREFIX):
            continue
        p = root / rel
        if not p.is_file() or blob_hash(p.read_bytes()) != blob:
            changed.append(rel)
    for d in CHECKED_DIRS:
        for p in (root / d).rglob("*.py") if (root / d).is_dir() else ():
            rel = p.relative_to(root).as_posix()
            if rel not in files and "__pycache__" not in rel and not rel.startswith(RESULTS_PREFIX):
                changed.append(rel)
    return changed


def write_stamp(root: Path = ROOT) -> Path:
    """``.hf_stamp.json``: HEAD's commit and the blob hash of every file in it, for a copy of
    the tree without ``.git`` (the device tool's); ignored through ``.git/info/exclude``.
    Refuses a dirty tree: a stamp of HEAD would not describe it."""
    state = source_state(root)
    if state["how"] != "git":
        raise SystemExit("--stamp needs a git checkout")
    if state["dirty"]:
        raise SystemExit(f"--stamp: the tree is dirty ({', '.join(state['changed'][:5])}): commit first")
    listing = _git(root, "ls-tree", "-r", "HEAD") or ""
    files = {}
    for line in listing.splitlines():
        meta, path = line.split("\t", 1)
        mode, kind, blob = meta.split()
        if kind == "blob" and mode != "120000":
            files[path] = blob
    out = root / STAMP
    out.write_text(json.dumps({"commit": state["commit"], "files": files}, indent=0) + "\n")
    exclude = _git(root, "rev-parse", "--git-path", "info/exclude")
    if exclude:
        path = Path(exclude.strip())
        path = path if path.is_absolute() else root / path
        text = path.read_text() if path.exists() else ""
        if f"/{STAMP}" not in text.split():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text + ("" if text.endswith("\n") or not text else "\n") + f"/{STAMP}\n")
    return out


# --------------------------------------------------------------------------- sections


ENV_KEYS = ("gpu", "torch", "triton", "transformers", "fla")


def section_id(source: str, env: dict[str, Any]) -> str:
    """The key of a section: the source state and the environment it ran on."""
    return source + "|" + "|".join(str(env.get(k)) for k in ENV_KEYS)


class Section(dict):
    """One run at one source state on one environment: ``{"id", "commit", "dirty", "source",
    "env", "calls": [...], "records": [...]}``. ``add`` refuses records of another state."""

    @classmethod
    def new(cls, state: dict[str, Any], env: dict[str, Any]) -> "Section":
        return cls(id=section_id(state["source"], env), commit=state["commit"], dirty=state["dirty"],
                   changed=state.get("changed", []), source=state["source"], env=dict(env), calls=[], records=[])

    def add(self, call: dict[str, Any], records: list[dict[str, Any]]) -> None:
        """Add one device call (``{"id", "started", ...}``) and its records. A record of another
        source state or environment is refused (ValueError): a section is one commit's run.
        Records of the (family, case, variant) this call measured replace the section's earlier
        ones of those (a variant run again); a call added again replaces its own records."""
        for r in records:
            if r.get("source") != self["source"] or section_id(r.get("source"), r.get("env", {})) != self["id"]:
                raise ValueError(f"hf_models: a record of {r.get('source')!r} on {r.get('env')} cannot go "
                                 f"into the section of {self['source']!r} on {self['env']}: one run, one commit")
        measured = {_variant_key(r) for r in records}
        mine = call["id"]
        self["records"] = [r for r in self["records"] if r.get("call") != mine and _variant_key(r) not in measured]
        self["records"] += records
        self["calls"] = [c for c in self["calls"] if c["id"] != mine] + [call]


def _variant_key(record: dict[str, Any]) -> tuple:
    return record.get("family"), record.get("case"), record.get("variant")


def load_sections(path: Path) -> list[dict[str, Any]]:
    """The sections recorded in ``path`` (an hf_models.json), oldest first; an older file of
    merged rows becomes one legacy section per date (commit unknown)."""
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    if "sections" in data:
        return [Section(s) for s in data["sections"]]
    return legacy_sections(data)


def legacy_sections(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of a pre-section hf_models.json, one section per run date, commit unknown."""
    by_date: dict[str, list] = {}
    for row in data.get("rows", []):
        by_date.setdefault(row.get("date") or data.get("env", {}).get("date"), []).append(row)
    env = data.get("env", {})
    return [Section(id=f"legacy|{date}", commit="unknown", dirty=None, source="unknown",
                    env={**env, "date": date}, calls=[], records=[], legacy_rows=rows)
            for date, rows in sorted(by_date.items(), key=lambda kv: str(kv[0]))]


def save_sections(path: Path, sections: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"benchmark": "hf_models", "sections": sections}, indent=1, default=str) + "\n")


def merge_into(sections: list[dict[str, Any]], state: dict[str, Any], env: dict[str, Any],
               call: dict[str, Any], records: list[dict[str, Any]]) -> Section:
    """Add one call's records to the section of ``state`` on ``env`` (made if new); returns it."""
    sid = section_id(state["source"], env)
    for s in sections:
        if s["id"] == sid:
            break
    else:
        s = Section.new(state, env)
        sections.append(s)
    s.add(call, records)
    return s


def merge_files(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """The sections of several hf_models.json files (the copies several device calls brought
    back), merged: a section seen in more than one gets every call's records, the calls replayed
    in the order they started, so that a variant measured again replaces its earlier records
    whichever file holds the older copy of them (each file also carries the calls before it)."""
    merged: list[Section] = []
    calls: dict[str, dict[str, tuple]] = {}
    for path in paths:
        for s in load_sections(Path(path)):
            if not any(m["id"] == s["id"] for m in merged):
                merged.append(Section(s, calls=[], records=list(_callless(s))))
            for call in s.get("calls", []):
                calls.setdefault(s["id"], {})[call["id"]] = (call, [r for r in s["records"]
                                                                      if r.get("call") == call["id"]])
    for m in merged:
        for call, records in sorted(calls.get(m["id"], {}).values(), key=lambda cr: str(cr[0].get("started"))):
            m.add(call, records)
    return merged


def _callless(section: dict[str, Any]) -> list[dict[str, Any]]:
    """The records of ``section`` no call of it claims (legacy rows, hand-kept records)."""
    ids = {c["id"] for c in section.get("calls", [])}
    return [r for r in section.get("records", []) if r.get("call") not in ids]


def write_markdown(path: Path, title: str, intro: str, section: dict[str, Any], body: str) -> Path:
    """Put ``section``'s rendering (``body``) into ``path`` between its markers: replaced in
    place if the file has them, else appended. Everything else in the file is kept."""
    begin = BEGIN.format(section["id"])
    block = f"{begin}\n{body.rstrip()}\n{END}\n"
    text = path.read_text() if path.exists() else f"# {title}\n\n{intro.strip()}\n"
    if begin in text:
        head, rest = text.split(begin, 1)
        tail = rest.split(END, 1)[1].lstrip("\n") if END in rest else ""
        text = head + block + ("\n" + tail if tail else "")
    else:
        text = text.rstrip("\n") + "\n\n" + block
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def short(commit: str) -> str:
    return commit[:10] if commit and commit != "unknown" else "unknown"


def heading(section: dict[str, Any]) -> str:
    """``## date · commit X[ (dirty)] · GPU · torch · triton · transformers · fla-core``."""
    env = section["env"]
    state = short(section["commit"]) + (" (dirty: the tree differed from it)" if section.get("dirty") else "")
    if section["commit"] == "unknown":
        state = "unknown commit"
    started = min((c["started"] for c in section.get("calls", [])), default=env.get("date"))
    return (f"## {started} · commit {state} · {env.get('gpu') or 'CPU'} · torch {env.get('torch')} · "
            f"triton {env.get('triton')} · transformers {env.get('transformers')} · fla-core {env.get('fla')}")


def env_versions() -> dict[str, Any]:
    """transformers and fla-core versions (None where not installed)."""
    out: dict[str, Any] = {}
    for key, module in (("transformers", "transformers"), ("fla", "fla")):
        try:
            mod = __import__(module)
            out[key] = getattr(mod, "__version__", "installed")
        except ImportError:
            out[key] = None
    return out


def call_id() -> str:
    return os.environ.get("HF_CALL_ID") or hashlib.sha1(os.urandom(8)).hexdigest()[:8]
