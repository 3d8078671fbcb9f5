"""Comments and docs name files that exist (issue 28: stale comments pointed at files
that no longer exist, after a module was split or moved).

Every ``name.py`` written in the package's source (comments, docstrings) and in
ARCHITECTURE.md and docs/ must be a file of the repository: at that path, under the
package, beside the file that names it, or (a bare name) somewhere in the tree.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAMED = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*\w+\.py)\b")
PLACEHOLDERS = {"tests/test_x.py"}  # docs/testing.md: "pytest tests/test_x.py" as an example
# A fenced block that opens with "# NAME.py" is a file the reader saves (tests/test_docs_run.py
# saves it so): its document names it, not the repository.
SAVED_AS = re.compile(r"^```python\n# ([\w-]+\.py)\b", flags=re.M)
SKIP_DIRS = {".venv", ".git", "node_modules", "cdk.out", "build", "dist", "__pycache__"}


def _files(pattern: str) -> list[Path]:
    return [p for p in ROOT.glob(pattern) if not SKIP_DIRS & set(p.relative_to(ROOT).parts)]


def _stale() -> list[str]:
    every = {p.relative_to(ROOT).as_posix() for p in _files("**/*.py")}
    names = {path.rsplit("/", 1)[-1] for path in every}
    sources = [
        *_files("sqs_lease/**/*.py"),
        ROOT / "ARCHITECTURE.md",
        *_files("docs/*.md"),
    ]
    stale = []
    for source in sources:
        here = source.parent.relative_to(ROOT).as_posix()
        text = source.read_text(encoding="utf-8")
        saved = set(SAVED_AS.findall(text))
        for n, line in enumerate(text.splitlines(), 1):
            for named in NAMED.findall(line):
                if named in PLACEHOLDERS or named in saved:
                    continue
                places = {named, f"sqs_lease/{named}", f"{here}/{named}".lstrip("./")}
                if places & every or ("/" not in named and named in names):
                    continue
                stale.append(f"{source.relative_to(ROOT)}:{n}: {named}")
    return stale


def test_every_file_named_in_comments_and_docs_exists() -> None:
    assert _stale() == []
