"""The documentation cannot silently go stale: the parameter reference and the docstrings the
API reference renders list exactly the arguments and settings the code has, every relative link
in the README and docs/ points to a file (and heading) inside the repository, and no link leaves
it. The docs site itself is built, strictly, by .ci/run (mkdocs.yml)."""

from __future__ import annotations

import dataclasses
import importlib.util
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


PARAM = re.compile(r"^\s*:param\s+(?:[^:\s]+\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*:", re.M)


def docstring_parameters(obj) -> set[str]:
    """The names of the ``:param name:`` fields of ``obj``'s docstring (what the API reference renders)."""
    return set(PARAM.findall(inspect.getdoc(obj) or ""))


def test_the_docstrings_document_every_parameter_the_api_reference_renders():
    """docs/api.md renders these docstrings: each must have a ``:param:`` for every keyword argument (or
    dataclass field) and none for a name the code does not have, as docs/parameters.md must."""
    from airflow_streambatch.engine.context import DataContext
    from airflow_streambatch.engine.execution_resources import ExecutionOptions
    from airflow_streambatch.hooks.object_store import ObjectStoreHook
    from airflow_streambatch.hooks.streambatch import StreamBatchHook
    from airflow_streambatch.operators.streambatch import StreamBatchOperator
    from airflow_streambatch.sensors.epoch import EpochSensor

    problems = []
    for cls, code in [*((c, keyword_parameters(c)) for c in (StreamBatchOperator, EpochSensor, StreamBatchHook,
                                                             ObjectStoreHook)),
                      *((c, {f.name for f in dataclasses.fields(c)}) for c in (DataContext, ExecutionOptions))]:
        docs = docstring_parameters(cls)
        if code - docs:
            problems.append(f"{cls.__module__}.{cls.__name__}: add ':param name:' for {sorted(code - docs)}")
        if docs - code:
            problems.append(f"{cls.__module__}.{cls.__name__}: {sorted(docs - code)} are documented but not parameters")
    assert not problems, "\n".join(problems)


def test_the_docstring_check_reads_sphinx_fields():
    def documented_function(a, b):
        """Why.

        :param a: the first, on
            two lines.
        :param int b: typed.
        :returns: nothing.
        """

    assert docstring_parameters(documented_function) == {"a", "b"}


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


ABSOLUTE_URL = re.compile(r"(?i)(?:\b(?:https?|ftp)://|\bwww\.)[^\s<>()\]]*[^\s<>()\].,;:!?'\"]")


def absolute_links(path: Path) -> list[tuple[int, str]]:
    """``(line number, URL)`` of every absolute web address outside code blocks and code spans: in a
    link, a reference definition, an autolink ``<https://...>`` or bare text (which GitHub links too)."""
    found, fenced = [], False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            found += [(number, url) for url in ABSOLUTE_URL.findall(CODE_SPAN.sub("", line))]
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_link_leaves_the_repository(doc: Path):
    """The docs link only to files of this repository, relatively: a link to a web page goes stale
    and leaves the docs site, and an absolute link to a file of this repository (a GitHub URL) shows
    another branch's file. Addresses inside code (`http://localhost:8080`) are not links."""
    found = [f"{doc.relative_to(ROOT)}:{number}: {url}" for number, url in absolute_links(doc)]
    assert not found, ("links outside the repository (link to a file here by its relative path, or name the "
                       "page in plain text):\n" + "\n".join(found))


def test_the_absolute_link_checker_sees_every_form_and_skips_code(tmp_path: Path):
    doc = tmp_path / "x.md"
    doc.write_text("[a](https://github.com/o/airflow-streambatch/blob/main/docs/deploy.md) see\n"
                   "<http://example.com/x> and www.example.org, `http://localhost:8080`\n"
                   "```\ncurl http://object-store:9000\n```\n[ref]: https://example.com/ref\n[ok](docs/a.md)\n",
                   encoding="utf-8")
    assert absolute_links(doc) == [(1, "https://github.com/o/airflow-streambatch/blob/main/docs/deploy.md"),
                                   (2, "http://example.com/x"), (2, "www.example.org"),
                                   (6, "https://example.com/ref")]


def site_hooks():
    """docs/_mkdocs/hooks.py, the docs site's MkDocs hooks (mkdocs.yml), as a module."""
    pytest.importorskip("mkdocs", reason="the docs extra: pip install '.[docs]'")
    spec = importlib.util.spec_from_file_location("site_hooks", ROOT / "docs" / "_mkdocs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_site_serves_the_root_files_links_as_its_pages():
    """README.md is the site's home page: its links to docs/ and the root's files name the site's pages,
    and a link from docs/ to the README names the home page, so the strict build finds every target."""
    hooks = site_hooks()
    assert hooks.site_target("docs/deploy.md#gpus", "README.md") == "deploy.md#gpus"
    assert hooks.site_target("CHANGELOG.md", "README.md") == "changelog.md"
    assert hooks.site_target("../README.md#install", "docs/install.md") == "index.md#install"
    assert hooks.site_target("../../CHANGELOG.md", "docs/bench/order_cost.md") == "../changelog.md"
    assert hooks.site_target("airflow.md#epoch-view", "docs/deploy.md") == "airflow.md#epoch-view"
    assert hooks.site_target("#install", "README.md") == "#install"
    assert hooks.site_target("dags/text_embedding.py", "README.md") == "dags/text_embedding.py"  # not in the site
    text = "[d](docs/deploy.md) `[c](docs/code.md)`\n```\n[f](docs/fenced.md)\n```\n[r]: docs/ref.md\n"
    assert hooks.rewrite_links(text, "README.md") == ("[d](deploy.md) `[c](docs/code.md)`\n```\n"
                                                      "[f](docs/fenced.md)\n```\n[r]: ref.md\n")


def test_the_link_checker_sees_links_and_skips_code(tmp_path: Path):
    doc = tmp_path / "x.md"
    doc.write_text("# A `b` heading\n[one](docs/a.md) ![img](i.png) `[not](a link)`\n"
                   "```\n[not](in/a/fence.md)\n```\n[ref]: ../outside.md\n[web](https://example.com)\n",
                   encoding="utf-8")
    assert relative_links(doc) == [(2, "docs/a.md"), (2, "i.png"), (6, "../outside.md")]
    assert anchors(doc) == {"a-b-heading"}
