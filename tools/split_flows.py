#!/usr/bin/env python3
"""Split ``sqs_lease/_core/flows.py`` into modules by concern (issue 28, item 3).

Re-runnable and deterministic: run it on a tree that still has ``flows.py``::

    python3 tools/split_flows.py .          # repo root; then the checks below

What it does, in order (stdlib only; it fails loudly, changing nothing, when the
tree holds something its tables do not know):

1. Parses ``flows.py`` and cuts its top-level statements into segments: a segment
   runs from the end of the previous statement, so leading comments and section
   markers travel with it; a bare docstring after an assignment travels with it.
2. Assigns every defined name to a module by ``HOME`` below. A top-level name the
   table does not know (a new function) stops the script with the list: add it.
3. Writes each module: its docstring (``MODULES``), the original import block,
   imports of the sibling names it uses, its segments in their original order.
   The sibling import graph must be acyclic (else it stops and prints the cycle).
4. Renames the private helpers used outside their new module (or imported by
   another module of the package) to public names (``RENAMES`` or the name
   without its underscore), so no module imports another's private name.
5. Deletes ``flows.py`` and rewrites every use: ``from ... flows import``
   (grouped by new module), ``flows.<name>`` (module attribute) and the code
   references in docstrings and docs (``flows.<name>``, ``sqs_lease._core.flows``,
   ARCHITECTURE.md's layout line). A mutation's ``_patch(flows, "x", ...)`` and a
   test's ``flows.__dict__["x"]`` name the module(s) that look ``x`` up at call
   time (several: ``_patch`` takes a tuple of owners).
6. Runs ``ruff check --fix --select F401,I001`` and ``ruff format`` on the files
   it touched (``.venv/bin/ruff`` or ``ruff`` on PATH).

Then run: ``.venv/bin/ruff check . && .venv/bin/mypy`` and the tests
(tests/test_core_*.py, tests/test_sim*.py -n 2, the worker tests).
"""

from __future__ import annotations

import ast
import contextlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

CORE = "sqs_lease/_core"

# module -> (docstring, ARCHITECTURE.md layout text)
MODULES: dict[str, tuple[str, str]] = {
    "messages": (
        "Messages: the body format, parsing a received message, the receive flow, and the\n"
        "batch and queue helpers the other flows share.",
        "the message body, parse_message (Delivery or Poison), receive_flow,\n"
        "shared batch sizes and per-queue grouping",
    ),
    "sending": (
        "Submitting a job and sending its message: one send id per message, the fenced\n"
        "take-over of an unsent send, grouped submits.",
        "submit_flow, send_job_message / send_record_message (one send id per\n"
        "message), taking over an unsent send",
    ),
    "sweeping": (
        "The stranded sweep: records whose message was never sent, found through the\n"
        "``unsent`` index and sent (or cleared) by the sweep.",
        "sweep_flow: stranded records (no sent message) read from the unsent index",
    ),
    "claiming": (
        "Claiming a received job: the fenced claim, admitting a message of a known or\n"
        "unknown class, and what becomes of an undeliverable one.",
        "claim_flow, admit_flow (unknown classes, deferral), undeliverable messages",
    ),
    "heartbeats": (
        "The heartbeat: extending the held leases' visibility, the verdict of each beat,\n"
        "and how a lost lease is recorded on the local lease.",
        "heartbeat_flow, beat verdicts, apply_beats / lose / gave_back",
    ),
    "fencing": (
        "The fenced end write shared by every ending: recognising one's own write,\n"
        "the fenced tries, the visibility change and delete that follow.",
        "the fenced end write every ending shares (own_end_write, Finish,\n"
        "fenced tries, set_visibility, the delete)",
    ),
    "endwrites": (
        "How an attempt ends, one flow per ending: commit, fail, retry, park, release,\n"
        "poison; each a fenced write of the record, then the message's fate.",
        "commit_flow, fail_flow, retry_flow, park_flow, release_flow, poison_flow",
    ),
    "cancelling": (
        "Cancelling a job: the cancel marker on its record and the per-job cancel flow.",
        "cancel_flow, cancel_one, cancel_job_flow",
    ),
}

_GROUPS: dict[str, str] = {
    "messages": "SQS_BATCH DDB_BATCH_GET COMMIT_TRIES BATCH_GET_TRIES MESSAGE_VERSION "
    "UNSENT_GRACE_SECONDS _chunks Q _by_queue _lease_queue _fail_call Delivery Poison "
    "message_body on_queue parse_message _text _parse_message _count _epoch receive_flow",
    "sending": "SubmitResult SendVerdict SendOutcome send_job_message send_record_message "
    "submit_flow GROUP_SUBMIT_PAUSES _transient_txn _failed_condition _grouped_put "
    "_own_unsent_take _take_send",
    "sweeping": "StrandedVerdict Stranded SweepReport SWEEP_PAGES _index_key home_queue "
    "sweep_flow _sweep_one _parsed_or_none _clear_entry _unreadable_stranded",
    "claiming": "Claimed NotClaimedOutcome NotClaimed ClaimResult claim_flow _refused_claim "
    "_is_current UNKNOWN_CLASS_RECEIVES UNKNOWN_CLASS_BACKOFF defer_delay admit_flow "
    "_undeliverable _poison_delivery _refusal",
    "heartbeats": "BeatStatus Beat HeartbeatReport _LEASE_GONE_CODES heartbeat_flow _wall_of "
    "BeatOutcome LossSource LOSS_KNOWN lost_event lose gave_back rejected_loss apply_beats "
    "_refused_for_value set_visibility_call _still_ours _finished_by _verdict",
    "fencing": "end_write_id own_end_write FinishOutcome Finish set_visibility _delete "
    "_fenced_write _fenced_tries _limit_hint _why_rejected",
    "endwrites": "_end_attempt commit_flow fail_flow retry_flow park_flow release_flow poison_flow",
    "cancelling": "cancel_flow cancel_one CancelVerdict Cancelled cancel_job_flow",
}
HOME: dict[str, str] = {n: m for m, names in _GROUPS.items() for n in names.split()}

# Private helpers that become public under a name other than the bare one (the bare
# one would shadow a local name somewhere, or say too little once it is public).
RENAMES: dict[str, str] = {
    "_text": "text_attribute",
    "_count": "count_attribute",
    "_epoch": "epoch_attribute",
    "_delete": "delete_message",
    "_verdict": "write_verdict",
}

PATCH_DEF_OLD = """def _patch(owner: Any, name: str, value: Any) -> Iterator[None]:
    missing = object()
"""
PATCH_DEF = """def _patch(owner: Any, name: str, value: Any) -> Iterator[None]:
    if isinstance(owner, tuple):  # a name several modules look up at call time: each
        with ExitStack() as stack:
            for one in owner:
                stack.enter_context(_patch(one, name, value))
            yield
        return
    missing = object()
"""

SCAN_DIRS = ("sqs_lease", "tests", "simtools", "benchmarks")
DOCS = ("ARCHITECTURE.md", "docs")


def fail(msg: str) -> None:
    print(f"split_flows: {msg}", file=sys.stderr)
    raise SystemExit(1)


# ----------------------------------------------------------------------------- parse


def defined_names(node: ast.stmt) -> list[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [node.name]
    if isinstance(node, ast.Assign):
        out = []
        for t in node.targets:
            if not isinstance(t, ast.Name):
                fail(f"line {node.lineno}: unsupported assignment target")
            out.append(t.id)
        return out
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    fail(f"line {node.lineno}: unsupported top-level statement {type(node).__name__}")
    return []


def is_docstring(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


def loaded_names(tree: ast.AST) -> set[str]:
    """Global-looking names a piece of code reads (string annotations included)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            out.add(node.id)
        ann = None
        if isinstance(node, ast.arg | ast.AnnAssign):
            ann = node.annotation
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            ann = node.returns
        if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
            with contextlib.suppress(SyntaxError):
                out |= loaded_names(ast.parse(ann.value, mode="eval"))
    return out


class Source:
    def __init__(self, path: Path) -> None:
        self.text = path.read_text()
        self.lines = self.text.splitlines(keepends=True)
        tree = ast.parse(self.text)
        body = tree.body
        i = 0
        if body and is_docstring(body[0]):
            i = 1
        first_import = i
        while i < len(body) and isinstance(body[i], ast.Import | ast.ImportFrom):
            i += 1
        self.imports = "".join(self.lines[body[first_import].lineno - 1 : body[i - 1].end_lineno])
        self.imported: set[str] = set()
        for node in body[first_import:i]:
            for a in node.names:  # type: ignore[attr-defined]
                self.imported.add(a.asname or a.name.split(".")[0])
        # segments: (names, text, ast nodes)
        self.segments: list[tuple[list[str], str, list[ast.stmt]]] = []
        prev_end = body[i - 1].end_lineno or 0
        while i < len(body):
            node = body[i]
            nodes = [node]
            end = node.end_lineno or 0
            names = defined_names(node)
            if (
                isinstance(node, ast.Assign | ast.AnnAssign)
                and i + 1 < len(body)
                and is_docstring(body[i + 1])
            ):
                i += 1
                nodes.append(body[i])
                end = body[i].end_lineno or 0
            text = "".join(self.lines[prev_end:end])
            self.segments.append((names, text, nodes))
            prev_end = end
            i += 1


# ----------------------------------------------------------------------------- plan


def resolve(file: Path, root: Path, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    parts = list(file.relative_to(root).with_suffix("").parts[:-1])
    if node.level > 1:
        parts = parts[: -(node.level - 1)]
    return ".".join([*parts, *([node.module] if node.module else [])])


def main(root: Path) -> None:
    flows_path = root / CORE / "flows.py"
    if not flows_path.exists():
        fail(f"{flows_path} not found (already split?)")
    src = Source(flows_path)

    all_names = [n for names, _, _ in src.segments for n in names]
    unknown = [n for n in all_names if n not in HOME]
    if unknown:
        fail("top-level names of flows.py with no module in HOME: " + ", ".join(unknown))
    stale = sorted(set(HOME) - set(all_names))
    if stale:
        print(f"split_flows: note: HOME names not in flows.py (ignored): {stale}")
    for m in MODULES:
        if (root / CORE / f"{m}.py").exists():
            fail(f"{CORE}/{m}.py exists already")

    # what each module uses, and from where
    uses: dict[str, set[str]] = {m: set() for m in MODULES}
    for names, _, nodes in src.segments:
        m = HOME[names[0]]
        for node in nodes:
            uses[m] |= loaded_names(node)
    needs: dict[str, dict[str, list[str]]] = {m: {} for m in MODULES}  # m -> other -> names
    for m in MODULES:
        for n in sorted(uses[m]):
            if n in HOME and HOME[n] != m:
                needs[m].setdefault(HOME[n], []).append(n)
    check_acyclic({m: set(d) for m, d in needs.items()})

    # which modules look a name up at call time (for patches)
    lookup: dict[str, list[str]] = {}
    for m in MODULES:
        for n in uses[m]:
            lookup.setdefault(n, []).append(m)
    for n, home in HOME.items():
        lookup.setdefault(n, [home])

    # external users of flows' names
    files = scan_files(root)
    external_private: set[str] = set()
    for f in files:
        if f.suffix != ".py":
            continue
        tree = ast.parse(f.read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.ImportFrom)
                and resolve(f, root, node) == "sqs_lease._core.flows"
                and f.parts[len(root.parts)] == "sqs_lease"
            ):
                external_private |= {a.name for a in node.names if a.name.startswith("_")}

    cross = {n for m, d in needs.items() for ns in d.values() for n in ns if n.startswith("_")}
    renames = {n: RENAMES.get(n, n.lstrip("_")) for n in sorted(cross | external_private)}
    for old, new in renames.items():
        if new in HOME or new in src.imported:
            fail(f"renaming {old} to {new} clashes with a name of flows.py")

    def rn(name: str) -> str:
        return renames.get(name, name)

    # ---- write the modules
    seg_text: dict[str, list[str]] = {m: [] for m in MODULES}
    for names, text, _ in src.segments:
        seg_text[HOME[names[0]]].append(text)
    touched: list[Path] = []
    for m, (doc, _) in MODULES.items():
        if not seg_text[m]:
            fail(f"module {m} would be empty")
        body = "".join(seg_text[m])
        body = rename_in(body, renames, attributes=False)
        sib = "".join(
            f"from .{o} import {', '.join(rn(n) for n in ns)}\n"
            for o, ns in sorted(needs[m].items())
        )
        imports = src.imports.rstrip("\n") + "\n" + sib
        text = f'"""{doc}\n"""\n\n{imports}{body}'
        if not text.endswith("\n"):
            text += "\n"
        clash = shadowing(text, renames)
        if clash:
            fail(f"{m}: a public name would shadow a local one: {clash} (add to RENAMES)")
        path = root / CORE / f"{m}.py"
        path.write_text(text)
        touched.append(path)
    flows_path.unlink()

    # ---- rewrite the users
    patched = set(
        re.findall(r'_patch\(flows, "(\w+)"', (root / "simtools/mutations.py").read_text())
    )
    for f in files:
        new = rewrite_file(f, root, renames, lookup, patched)
        if new is not None:
            f.write_text(new)
            touched.append(f)

    run_ruff(root, [p for p in touched if p.suffix == ".py"])
    print(
        f"split_flows: wrote {', '.join(MODULES)}; renamed {renames}; touched {len(touched)} files"
    )


def check_acyclic(graph: dict[str, set[str]]) -> None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for o in sorted(graph[n]):
            if state.get(o) == 1:
                fail("sibling import cycle: " + " -> ".join([*stack[stack.index(o) :], o]))
            if o not in state:
                visit(o)
        stack.pop()
        state[n] = 2

    for n in graph:
        if n not in state:
            visit(n)


def scan_files(root: Path) -> list[Path]:
    out: list[Path] = []
    for d in SCAN_DIRS:
        out += [p for p in sorted((root / d).rglob("*.py")) if "flows" in p.read_text()]
    for d in DOCS:
        p = root / d
        cands = [p] if p.is_file() else sorted(p.rglob("*.md"))
        out += [c for c in cands if "flows" in c.read_text()]
    return [p for p in out if p.parent != root / CORE or p.stem not in (*MODULES, "flows")]


def rename_in(text: str, renames: dict[str, str], *, attributes: bool) -> str:
    for old, new in renames.items():
        pat = rf"\b{re.escape(old)}\b" if attributes else rf"(?<![\w.]){re.escape(old)}\b"
        text = re.sub(pat, new, text)
    return text


def shadowing(text: str, renames: dict[str, str]) -> list[str]:
    """New public names that some function also binds locally (arg or assignment)."""
    new = set(renames.values())
    out = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.arg) and node.arg in new:
            out.add(node.arg)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id in new:
            out.add(node.id)
    return sorted(out)


def rewrite_file(
    f: Path,
    root: Path,
    renames: dict[str, str],
    lookup: dict[str, list[str]],
    patched: set[str],
) -> str | None:
    text = f.read_text()
    orig = text
    known = set(HOME) | patched

    def home_of(name: str) -> str:
        return HOME[name] if name in HOME else lookup[name][0]

    def rn(name: str) -> str:
        return renames.get(name, name)

    if f.suffix == ".md":
        text = rewrite_refs(text, renames, home_of, known)
        if f.name == "ARCHITECTURE.md":
            text = rewrite_layout(text)
        return text if text != orig else None

    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    edits: list[tuple[int, int, str]] = []  # (first line, last line) 1-based -> text
    module_import = False
    in_tests = f.parts[len(root.parts)] == "tests"
    attr_names = {
        n.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "flows"
    }
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        mod = resolve(f, root, node)
        indent = " " * node.col_offset
        prefix = "." * node.level + (node.module or "")
        if mod == "sqs_lease._core.flows":
            groups: dict[str, list[str]] = {}
            for a in node.names:
                if a.name not in HOME:
                    fail(f"{f}: imports {a.name} from flows, which flows.py does not define")
                alias = f" as {a.asname}" if a.asname else ""
                groups.setdefault(HOME[a.name], []).append(rn(a.name) + alias)
            base = prefix[: -len("flows")]
            new = "".join(
                f"{indent}from {base}{m} import {', '.join(ns)}\n"
                for m, ns in sorted(groups.items())
            )
            edits.append((node.lineno, node.end_lineno or node.lineno, new))
        elif mod == "sqs_lease._core" and any(a.name == "flows" for a in node.names):
            module_import = True
            mods: set[str] = set()
            for name in attr_names:
                if name == "__dict__":
                    continue
                mods.add(home_of(name))
            for name in re.findall(r'flows\.__dict__\["(\w+)"\]', text):
                mods |= set(lookup[name])
            for name in re.findall(r'_patch\(flows, "(\w+)"', text):
                mods |= set(lookup[name])
            if in_tests:
                mods |= {m for n in attr_names if n in patched for m in lookup[n]}
            names = sorted({a.name for a in node.names if a.name != "flows"} | mods)
            new = f"{indent}from {prefix} import {', '.join(names)}\n"
            edits.append((node.lineno, node.end_lineno or node.lineno, new))
    for first, last, new in sorted(edits, reverse=True):
        lines[first - 1 : last] = [new]
    text = "".join(lines)

    if module_import:

        def patch_sub(m: re.Match[str]) -> str:
            owners = lookup[m.group(2)]
            if m.group(1) == "_require" or len(owners) == 1:
                own = owners[0]
            else:
                own = "(" + ", ".join(owners) + ")"
            return f'{m.group(1)}({own}, "{rn(m.group(2))}"'

        text = re.sub(r'(_patch|_require)\(flows, "(\w+)"', patch_sub, text)
        if re.search(r"_patch\(\(", text) and PATCH_DEF not in text:
            if PATCH_DEF_OLD not in text:
                fail(f"{f}: a name is patched in several modules, and _patch is not as expected")
            text = text.replace(PATCH_DEF_OLD, PATCH_DEF)

        def dict_sub(m: re.Match[str]) -> str:
            owners = lookup[m.group(1)]
            parts = [f'{o}.__dict__["{rn(m.group(1))}"]' for o in owners]
            return parts[0] if len(parts) == 1 else "(" + ", ".join(parts) + ")"

        text = re.sub(r'flows\.__dict__\["(\w+)"\]', dict_sub, text)

        def attr_sub(m: re.Match[str]) -> str:
            name = m.group(1)
            if in_tests and name in patched:
                owners = lookup[name]
                parts = [
                    f"{o}.{rn(name)}" if HOME.get(name) == o else f'{o}.__dict__["{rn(name)}"]'
                    for o in owners
                ]
                return parts[0] if len(parts) == 1 else "(" + ", ".join(parts) + ")"
            return f"{home_of(name)}.{rn(name)}"

        text = re.sub(
            r"(?<![\w.])flows\.(\w+)\b",
            lambda m: attr_sub(m) if m.group(1) in known else m.group(0),
            text,
        )
    else:
        text = rewrite_refs(text, renames, home_of, known)
    # names imported from flows, used in the file under their old private name
    text = (
        rename_in(
            text,
            {o: n for o, n in renames.items() if re.search(rf"\b{n}\b", text)},
            attributes=True,
        )
        if f.parts[len(root.parts)] == "sqs_lease"
        else text
    )
    text = text.replace(
        "import sqs_lease._core.flows,",
        "".join(f"import sqs_lease._core.{m}\n" for m in MODULES) + "import",
    )
    return text if text != orig else None


def rewrite_refs(text: str, renames: dict[str, str], home_of, known: set[str]) -> str:  # type: ignore[no-untyped-def]
    """Code references in prose: ``flows.x``, ``sqs_lease._core.flows.x``."""

    def sub(m: re.Match[str]) -> str:
        name = m.group(2)
        if name not in known:
            return m.group(0)
        return f"{m.group(1)}{home_of(name)}.{renames.get(name, name)}"

    pattern = r"((?:sqs_lease\._core\.)?)flows\.(\w+)\b"
    return re.sub(pattern, lambda m: m.group(0) if _after_dot(text, m) else sub(m), text)


def _after_dot(text: str, m: re.Match[str]) -> bool:
    i = m.start()
    return i > 0 and (text[i - 1].isalnum() or text[i - 1] in "_.") and not m.group(1)


def rewrite_layout(text: str) -> str:
    """ARCHITECTURE.md: the one ``flows.py`` entry of the layout becomes one per module."""
    pat = re.compile(r"^( *)flows\.py( +)(.*)\n((?:\1 {9,}.*\n)*)", re.M)
    m = pat.search(text)
    if not m:
        return text
    indent = m.group(1)
    col = len("flows.py") + len(m.group(2))
    out = []
    for mod, (_, layout) in MODULES.items():
        first, *rest = layout.split("\n")
        name = f"{mod}.py"
        out.append(f"{indent}{name.ljust(col - 1)} {first}\n")
        out += [f"{indent}{' ' * col}{r}\n" for r in rest]
    return text[: m.start()] + "".join(out) + text[m.end() :]


def run_ruff(root: Path, paths: list[Path]) -> None:
    ruff = root / ".venv/bin/ruff"
    exe = str(ruff) if ruff.exists() else shutil.which("ruff")
    if not exe:
        print("split_flows: ruff not found; run ruff check --fix and ruff format yourself")
        return
    args = [str(p) for p in paths]
    subprocess.run([exe, "check", "--fix", "--select", "F401,I001", "-q", *args], cwd=root)
    subprocess.run([exe, "format", "-q", *args], cwd=root)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve())
