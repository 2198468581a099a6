"""The documentation cannot silently go stale: the parameter reference lists exactly the
arguments and settings the code has, and every relative link in the README and docs/
points to a file (and heading) inside the repository."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "parameters.md"
DOCS = sorted([ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").rglob("*.md")])

FENCE = re.compile(r"^(```|~~~)")
CODE_SPAN = re.compile(r"`[^`\n]*`")
INLINE_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def section(text: str, title: str) -> str:
    """The body of the ``## <title>`` section (up to the next ``## `` heading)."""
    match = re.search(rf"^## {re.escape(title)}\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"{REFERENCE.relative_to(ROOT)} has no '## {title}' section"
    return match.group(1)


def documented(text: str, title: str) -> set[str]:
    """The names in the first column of the tables of a section: rows such as ``| `name` | ...``."""
    return set(re.findall(r"^\|\s*`([A-Za-z_][A-Za-z0-9_]*)`\s*\|", section(text, title), re.M))


def keyword_parameters(cls) -> set[str]:
    return {name for name, p in inspect.signature(cls.__init__).parameters.items()
            if name != "self" and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}


def test_the_operator_and_sensor_reference_lists_every_keyword_parameter():
    from airflow_streambatch.operators.streambatch import StreamBatchOperator
    from airflow_streambatch.sensors.epoch import EpochSensor

    text = REFERENCE.read_text(encoding="utf-8")
    for cls in (StreamBatchOperator, EpochSensor):
        code, docs = keyword_parameters(cls), documented(text, cls.__name__)
        assert not code - docs, f"docs/parameters.md, '## {cls.__name__}': add rows for {sorted(code - docs)}"
        assert not docs - code, f"docs/parameters.md, '## {cls.__name__}': {sorted(docs - code)} are not parameters"


def test_the_datacontext_reference_lists_every_field():
    from airflow_streambatch.engine.context import DataContext

    text = REFERENCE.read_text(encoding="utf-8")
    code, docs = {f.name for f in dataclasses.fields(DataContext)}, documented(text, "DataContext")
    assert not code - docs, f"docs/parameters.md, '## DataContext': add rows for {sorted(code - docs)}"
    assert not docs - code, f"docs/parameters.md, '## DataContext': {sorted(docs - code)} are not fields"


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = CODE_SPAN.sub(lambda m: m.group(0).strip("`"), heading.strip()).lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found, seen, fenced = set(), {}, False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match and not fenced:
            base = slug(match.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def relative_links(path: Path) -> list[tuple[int, str]]:
    """``(line number, target)`` of every link and image outside code blocks and code spans,
    except those with a scheme (``https:``, ``mailto:``)."""
    links, fenced = [], False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if fenced:
            continue
        text = CODE_SPAN.sub("", line)
        targets = INLINE_LINK.findall(text)
        definition = REFERENCE_DEFINITION.match(text)
        if definition:
            targets.append(definition.group(1))
        links += [(number, t) for t in targets if not SCHEME.match(t)]
    return links


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_to_a_file_inside_the_repository(doc: Path):
    problems = []
    for number, target in relative_links(doc):
        where = f"{doc.relative_to(ROOT)}:{number}: {target}"
        file_part, _, anchor = target.partition("#")
        resolved = (doc.parent / file_part).resolve() if file_part else doc
        if not resolved.is_relative_to(ROOT):
            problems.append(f"{where} points outside the repository")
        elif not resolved.exists():
            problems.append(f"{where} does not exist")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{where}: {resolved.relative_to(ROOT)} has no heading with anchor #{anchor}")
    assert not problems, "\n".join(problems)


def test_the_link_checker_sees_links_and_skips_code(tmp_path: Path):
    doc = tmp_path / "x.md"
    doc.write_text("# A `b` heading\n[one](docs/a.md) ![img](i.png) `[not](a link)`\n"
                   "```\n[not](in/a/fence.md)\n```\n[ref]: ../outside.md\n[web](https://example.com)\n",
                   encoding="utf-8")
    assert relative_links(doc) == [(2, "docs/a.md"), (2, "i.png"), (6, "../outside.md")]
    assert anchors(doc) == {"a-b-heading"}
