"""Real English text for the inference benchmark (W4): the docstrings of Python's standard library.

Synthetic text (``airflow_streambatch.demo.generate`` builds reviews from a few dozen
fragments) makes every batch look alike: the tokenizer sees the same short lengths,
and padding never costs anything. Docstrings are prose written by many people, with
real variation in length and vocabulary, and they ship with every Python: nothing
is downloaded, and the same interpreter version always yields the same text, in the
same order (files are read in sorted order, the sets are sorted, then shuffled with
a fixed seed). Another Python version gives a similar but not identical set.

Two sets:

* ``short``: single sentences (30-300 characters, starting uppercase, ending with a
  full stop): 9,811 on CPython 3.11.7, 78 characters on average;
* ``long``: whole prose paragraphs of three or more sentences (300-1200 characters),
  as many as the docstrings have: 215 on CPython 3.11.7, 406 characters on average.
  Most docstring paragraphs are one or two sentences, so there are few.

Sources: ``<stdlib>/*.py`` and ``<stdlib>/<package>/*.py`` (no tests, IDLE or
site-packages), the docstrings of modules, classes and functions (``ast.get_docstring``).
Code-ish text is left out, as it is mostly signatures and examples rather than
English: paragraphs with doctest lines, and lines of bullet or field lists
(``name: ...``, ``:param x:``), indented lines, and lines with brackets, braces,
``=``, ``<``, ``>`` or ``()``. A ``long`` paragraph has no such line at all; ``short``
sentences come from the prose lines between them.

    python -m benchmarks.sentences          # prints how many of each and a sample
"""

from __future__ import annotations

import ast
import functools
import os
import random
import re
import sysconfig

import pyarrow as pa
import pyarrow.parquet as pq

SEED = 20260404
SHORT = (30, 300)  # characters per sentence
LONG = (300, 1200)  # characters per paragraph
LONG_MIN_SENTENCES = 3
_SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "dist-packages", "__pycache__"}
_CODE_CHARS = re.compile(r"[{}=<>\[\]]|\(\)")
_LIST_ITEM = re.compile(r"^([-*+\u2022]|\d+[.)]|[a-z][.)])\s")
_FIELD = re.compile(r"^(:\w|\w+:(\s|$))")  # "Args:", "name: what", ":param x:"
# a sentence ends at ., ! or ? followed by space and an uppercase letter; "e.g. Foo" splits too (rare)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


def _source_files(stdlib: str) -> list[str]:
    """``<stdlib>/*.py`` and ``<stdlib>/<package>/*.py``, sorted, without tests, IDLE and third-party packages."""
    found = []
    for name in sorted(os.listdir(stdlib)):
        path = os.path.join(stdlib, name)
        if name.endswith(".py"):
            found.append(path)
        elif os.path.isdir(path) and name not in _SKIP_DIRS:
            found += [os.path.join(path, n) for n in sorted(os.listdir(path)) if n.endswith(".py")]
    return found


def _docstrings(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    nodes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    return [doc for doc in (ast.get_docstring(n) for n in nodes) if doc]


def _code_ish(line: str) -> bool:
    stripped = line.strip()
    return (line[:1].isspace() or stripped.startswith((">>>", "...", "$ ", "#")) or bool(_LIST_ITEM.match(stripped))
            or bool(_FIELD.match(stripped)) or bool(_CODE_CHARS.search(stripped)))


def _paragraphs(doc: str) -> list[tuple[bool, list[str]]]:
    """The docstring's paragraphs (blank-line separated), doctest ones left out: for each, whether
    it is all prose, and its runs of prose lines (each joined into one line), between code-ish lines."""
    paragraphs = []
    for block in re.split(r"\n\s*\n", doc):
        lines = [line.rstrip() for line in block.strip("\n").splitlines() if line.strip()]
        if not lines or any(line.lstrip().startswith(">>>") for line in lines):
            continue
        runs: list[list[str]] = [[]]
        for line in lines:
            if _code_ish(line):
                runs.append([])
            else:
                runs[-1].append(line.strip())
        paragraphs.append((len(runs) == 1, [" ".join(run) for run in runs if run]))
    return paragraphs


def _sentences(paragraph: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(paragraph) if s.strip()]


def _is_sentence(text: str) -> bool:
    return SHORT[0] <= len(text) <= SHORT[1] and text[0].isupper() and text.endswith(".")


def _is_paragraph(text: str) -> bool:
    return (LONG[0] <= len(text) <= LONG[1] and len(_sentences(text)) >= LONG_MIN_SENTENCES and text[0].isupper()
            and text.endswith("."))


@functools.lru_cache(maxsize=None)
def text_set(kind: str) -> tuple[str, ...]:
    """The ``short`` sentences or ``long`` paragraphs: deduplicated, sorted, then shuffled with `SEED`."""
    if kind not in ("short", "long"):
        raise ValueError(f"text set must be 'short' or 'long', got {kind!r}")
    found: set[str] = set()
    for path in _source_files(sysconfig.get_paths()["stdlib"]):
        for doc in _docstrings(path):
            for all_prose, runs in _paragraphs(doc):
                if kind == "short":
                    found.update(s for run in runs for s in _sentences(run) if _is_sentence(s))
                elif all_prose and _is_paragraph(runs[0]):
                    found.add(runs[0])
    texts = sorted(found)
    random.Random(SEED).shuffle(texts)
    return tuple(texts)


def write_text_set(kind: str, directory: str, files: int, limit: int | None = None) -> int:
    """Write the first ``limit`` texts of set ``kind`` (all by default) into ``files`` parquet files
    (``part-000.parquet``..., columns ``id: int64``, ``text: string``, rows split evenly) under
    ``directory``; returns the number of rows written."""
    texts = text_set(kind)[:limit]
    os.makedirs(directory, exist_ok=True)
    bounds = [len(texts) * f // files for f in range(files + 1)]
    for f in range(files):
        ids = range(bounds[f], bounds[f + 1])
        pq.write_table(pa.table({"id": pa.array(ids, pa.int64()), "text": pa.array(texts[bounds[f]:bounds[f + 1]],
                                                                                     pa.string())}),
                       os.path.join(directory, f"part-{f:03d}.parquet"))
    return len(texts)


if __name__ == "__main__":
    for kind in ("short", "long"):
        texts = text_set(kind)
        print(f"{kind}: {len(texts)} texts, mean {sum(map(len, texts)) / len(texts):.0f} chars")
        for text in texts[:3]:
            print("   ", text)
