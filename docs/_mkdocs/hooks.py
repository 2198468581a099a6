"""MkDocs hooks (mkdocs.yml ``hooks:``): the site is built from the repository's own Markdown.

The home page is README.md and the changelog and license pages are CHANGELOG.md and
LICENSE, read from the repository root at build time rather than copied into docs/, so
there is one text to keep right, the one GitHub shows. Their links are written for the
repository root (``docs/deploy.md``), so they are rewritten to the site's page names
(``deploy.md``); a link to any other file outside docs/ is left as it is, and the strict
build fails on it: the site serves only docs/ and these three files.
"""

from __future__ import annotations

import ast
import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
DOCS = "docs"
# repository file -> the site page it becomes
ROOT_PAGES = {"README.md": "index.md", "CHANGELOG.md": "changelog.md", "LICENSE": "license.md"}

# an inline link's or image's target, and a reference definition's (outside code: see _outside_code)
_INLINE_TARGET = re.compile(r"(\]\(\s*<?)([^)\s>]+)")
_DEFINITION_TARGET = re.compile(r"^(\s{0,3}\[[^\]]+\]:\s*<?)(\S+?)(?=>?(?:\s|$))", re.M)
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE_SPAN = re.compile(r"(`[^`\n]*`)")


def site_target(target: str, source: str) -> str:
    """``target``, a link written in the repository file ``source`` (a path from the root), as the
    page of the site it names: ``docs/x.md`` -> ``x.md`` from README.md, ``../README.md`` ->
    ``index.md`` from docs/x.md. URLs, anchors alone and files outside the site stay as they are."""
    if _SCHEME.match(target) or target.startswith(("#", "/")):
        return target
    path, hash_, anchor = target.partition("#")
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(source), path))
    if resolved in ROOT_PAGES:
        page = ROOT_PAGES[resolved]
    elif resolved.startswith(f"{DOCS}/"):
        page = resolved.removeprefix(f"{DOCS}/")
    else:
        return target
    site_source = ROOT_PAGES.get(source) or source.removeprefix(f"{DOCS}/")
    relative = posixpath.relpath(page, posixpath.dirname(site_source) or ".")
    return f"{relative}{hash_}{anchor}"


def rewrite_links(markdown: str, source: str) -> str:
    """Every link target outside code blocks and code spans, through `site_target`."""
    out, fenced = [], False
    for line in markdown.splitlines(keepends=True):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:  # code spans (the odd pieces of the split) stay as written
            pieces = _CODE_SPAN.split(line)
            for i in range(0, len(pieces), 2):
                pieces[i] = _INLINE_TARGET.sub(lambda m: m.group(1) + site_target(m.group(2), source), pieces[i])
                pieces[i] = _DEFINITION_TARGET.sub(lambda m: m.group(1) + site_target(m.group(2), source),
                                                   pieces[i])
            line = "".join(pieces)
        out.append(line)
    return "".join(out)


def _page_text(name: str) -> str:
    text = (ROOT / name).read_text(encoding="utf-8")
    if name == "LICENSE":
        return f"# License\n\n```text\n{text}```\n"
    return rewrite_links(text, name)


def on_config(config):
    """The package version for the theme's footer, read without importing the package."""
    init = (ROOT / "airflow_streambatch" / "__init__.py").read_text(encoding="utf-8")
    version = next(ast.literal_eval(node.value) for node in ast.parse(init).body
                   if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "__version__")
    config.extra["version"] = version
    return config


def on_files(files: Files, config) -> Files:
    """Add the home, changelog and license pages, generated from the repository root's files."""
    for name, page in ROOT_PAGES.items():
        if files.get_file_from_path(page) is not None:
            raise ValueError(f"docs/{page} would hide the page generated from {name}: remove or rename it")
        files.append(File.generated(config, page, content=_page_text(name)))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Links in docs/*.md to README.md, CHANGELOG.md or LICENSE (``../README.md``) name their pages."""
    if page.file.src_uri in ROOT_PAGES.values():
        return markdown  # generated above, already rewritten
    return rewrite_links(markdown, f"{DOCS}/{page.file.src_uri}")
