"""No document points at a file the repository does not contain (a reader of a clone has
only it). That the examples run as written: tests/test_docs_run.py."""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_SKIP_DIRS = {
    ".git",
    ".venv",
    "node_modules",
    "build",
    "dist",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    "cdk.out",
    ".demo",
    ".chaos",
}
_LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HREF = re.compile(r"""(?:href|src)=["']([^"']+)["']""")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
# A path that climbs out of the directory it is written in, or an absolute one
# into somebody's machine; and any name of a markdown document.
_CLIMB = re.compile(r"(?<![\w.])((?:\.\./)+[\w.-][\w./-]*)")
_ABSOLUTE = re.compile(r"(?<![\w.:/~])((?:/(?:work|home|root|Users|opt|srv|mnt)|~)/[\w.-][\w./-]*)")
_MD_NAME = re.compile(r"(?<![\w/.-])([\w./-]*\w\.md)\b")
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+")
# Commands in fenced blocks name the files they write (``--report out.md``).
_FENCED = re.compile(r"^```.*?^```", flags=re.S | re.M)


def _markdown_files() -> list[Path]:
    found = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS and not d.endswith(".egg-info")]
        found += [Path(dirpath) / f for f in filenames if f.endswith(".md")]
    return sorted(found)


def _inside_repo(path: Path) -> bool:
    return path.resolve().is_relative_to(ROOT)


def _references_leaving_the_repo(doc: Path, text: str) -> list[str]:
    """Every link, path or document name in ``text`` that is not a file of this repo."""
    problems: list[str] = []
    md_names = {p.name for p in _markdown_files()}
    for target in [*_LINK.findall(text), *_HREF.findall(text)]:
        if target.startswith("#") or _SCHEME.match(target):
            continue  # an anchor, or a web address
        local = target.split("#", 1)[0]
        path = (ROOT / local.lstrip("/")) if local.startswith("/") else doc.parent / local
        if not _inside_repo(path) or not path.exists():
            problems.append(f"link {target!r}")
    for climb in _CLIMB.findall(text):
        if not _inside_repo(doc.parent / climb):
            problems.append(f"path {climb!r}")
    problems += [f"path {p!r}" for p in _ABSOLUTE.findall(text)]
    for name in _MD_NAME.findall(_URL.sub(" ", _FENCED.sub(" ", text))):
        candidates = (doc.parent / name, ROOT / name)
        if not any(_inside_repo(c) and c.exists() for c in candidates) and (
            "/" in name or name not in md_names
        ):
            problems.append(f"document {name!r}")
    return problems


def test_the_scan_sees_links_paths_and_documents_that_leave_the_repo() -> None:
    readme = ROOT / "README.md"
    text = (
        "See [design](../shared/DESIGN.md), [ok](docs/protocol.md), "
        "[web](https://example.com/x.md), /work/shared/STYLE.md, ~/notes/todo.txt, "
        "DESIGN.md section 4, ARCHITECTURE.md and `../../etc/passwd`."
    )
    assert _references_leaving_the_repo(readme, text) == [
        "link '../shared/DESIGN.md'",
        "path '../shared/DESIGN.md'",
        "path '../../etc/passwd'",
        "path '/work/shared/STYLE.md'",
        "path '~/notes/todo.txt'",
        "document '../shared/DESIGN.md'",
        "document '/work/shared/STYLE.md'",
        "document 'DESIGN.md'",
    ]


def test_no_document_refers_to_a_file_outside_the_repository() -> None:
    docs = _markdown_files()
    assert ROOT / "README.md" in docs and ROOT / "docs" / "protocol.md" in docs
    problems = [
        f"{doc.relative_to(ROOT)}: {p}"
        for doc in docs
        for p in _references_leaving_the_repo(doc, doc.read_text(encoding="utf-8"))
    ]
    assert not problems, "\n".join(problems)


def test_the_readme_links_testing_your_handlers_and_the_page_shows_the_kit_from_pytest() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "[Testing your handlers](docs/testing.md)" in readme
    page = (ROOT / "docs" / "testing.md").read_text(encoding="utf-8")
    assert page.startswith("# Testing your handlers")
    assert "sqs_lease.testing" in page and "pytest11" in page
