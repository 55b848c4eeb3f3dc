"""Every repository path that README.md and docs/*.md name exists, and every relative link reaches a file and,
with a #fragment, a heading of it.

A repository path is a run of path characters that starts with one of the repository's top-level folders and
a slash (`launcher/core/plan.py`, `tests/unit/`, `benchmarks/hotpath.py`, `.ci/run`), anywhere in the text (in
backticks, in commands, in prose), outside link targets; it is read from the repository root. A path that
starts elsewhere is a user's (`/tmp/demo/train.py`, `~/.ssh/config`, `DIR/rank.N`, `checkpoints/last.pt`) and
is not checked. A link's target is read from the file's own folder; `#fragment` must be a heading's anchor by
GitHub's rule (lowercase, punctuation but `-` and `_` dropped, spaces to `-`, `-1`, `-2` for repeats)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# The top-level folders whose paths the docs name; a path starting anywhere else is not the repository's.
TOP_LEVEL = ("launcher", "collectives", "tests", "benchmarks", "docs", "examples", "hostfiles", ".ci")

FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]*)\)")
HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.*?)[ \t#]*$", re.MULTILINE)
REPO_PATH = re.compile(r"(?<![\w./~$@-])((?:" + "|".join(re.escape(t) for t in TOP_LEVEL) + r")/[\w./*-]*)")


def documents(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: links and images reduced to their text, lowercase, every character but
    letters, digits, spaces, `-` and `_` dropped, spaces to `-`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for match in HEADING.finditer(FENCE.sub("", text)):
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def repo_paths(text: str) -> list[str]:
    """The repository paths a document names, outside link targets (read from the document's folder)."""
    text = LINK.sub(lambda m: m.group(0)[: m.start(1) - m.start(0)] + ")", text)
    return [m.group(1).rstrip(".") for m in REPO_PATH.finditer(text)]


def path_exists(root: Path, path: str) -> bool:
    if any(c in path for c in "*?["):
        return any(root.glob(path))
    return (root / path).exists()


def problems(root: Path, docs: Iterable[Path]) -> list[str]:
    """One line per path that does not exist and per link that reaches no file or no heading."""
    found = []
    texts: dict[Path, str] = {}

    def text_of(path: Path) -> str:
        if path not in texts:
            texts[path] = path.read_text(encoding="utf-8")
        return texts[path]

    for doc in docs:
        name = doc.relative_to(root).as_posix()
        text = text_of(doc)
        for path in repo_paths(text):
            if not path_exists(root, path):
                found.append(f"{name}: no such path: {path}")
        for match in LINK.finditer(FENCE.sub("", text)):
            target = match.group(1)
            if not target or re.match(r"[a-z][a-z0-9+.-]*:", target):  # a URL, mailto:, ...
                continue
            file_part, _, fragment = target.partition("#")
            linked = (doc.parent / file_part).resolve() if file_part else doc
            if not linked.exists():
                found.append(f"{name}: link to a missing file: {target}")
            elif fragment and linked.suffix == ".md" and fragment not in anchors(text_of(linked)):
                found.append(f"{name}: link to a missing heading: {target}")
    return found


def test_every_path_and_link_in_readme_and_docs_exists() -> None:
    assert problems(REPO, documents(REPO)) == []


def test_the_docs_name_paths_the_check_reads() -> None:
    """The check is not vacuous: README and the guides name many repository paths and relative links."""
    named = {p for doc in documents(REPO) for p in repo_paths(doc.read_text())}
    assert {"examples/train.py", "benchmarks/hotpath.py", "launcher/agent/homing.py", ".ci/run"} <= named
    assert len(named) > 50


def test_a_missing_path_and_a_broken_anchor_are_named(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "launcher" / "core").mkdir(parents=True)
    (tmp_path / "launcher" / "core" / "plan.py").write_text("")
    (tmp_path / "README.md").write_text(
        "# Title\n\n## Same code, same software\n\n"
        "`launcher/core/plan.py` exists, `launcher/transport/srunstep.py` does not;\n"
        "`launcher/core/*.py` matches.\n"
        "Not the repository's: `/tmp/docs/x.py`, `~/.ssh/config`, `host1:4`, `checkpoints/last.pt`.\n"
        "[ok](#same-code-same-software) [stale](#same-code-same-stack) [guide](docs/usage.md#options)\n"
        "[gone](docs/gone.md) [web](https://example.com/docs/x.md#y) [link](launcher/nothing.py)\n"
        "`tests/unit/`\n"
        "```python\n# Not a heading\n[not](a-link.md)\n```\n"
    )
    (tmp_path / "docs" / "usage.md").write_text(
        "# Usage\n\n## Options\n\n## Options\n\n"
        "[back](../README.md#title) [twice](#options-1) [up](#missing)\n"
    )
    assert problems(tmp_path, documents(tmp_path)) == [
        "README.md: no such path: launcher/transport/srunstep.py",
        "README.md: no such path: tests/unit/",
        "README.md: link to a missing heading: #same-code-same-stack",
        "README.md: link to a missing file: docs/gone.md",
        "README.md: link to a missing file: launcher/nothing.py",
        "docs/usage.md: link to a missing heading: #missing",
    ]


def test_anchors_follow_githubs_rule() -> None:
    assert slug("Finding the slow node: `check --perf` and `--preflight`") == (
        "finding-the-slow-node-check---perf-and---preflight"
    )
    assert slug("Horovod features that torch.distributed cannot offer") == (
        "horovod-features-that-torchdistributed-cannot-offer"
    )
    assert slug("The same with torch's own DDP") == "the-same-with-torchs-own-ddp"
    assert slug("Passwordless SSH: `distrun ssh-setup`") == "passwordless-ssh-distrun-ssh-setup"
    assert slug("See [the loop](attempts.md) now") == "see-the-loop-now"
