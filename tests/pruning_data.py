"""The input the read-pruning tests share: one Parquet file of 8 row groups, one language per row group
(so min/max statistics can rule a row group out), and a large column that nobody asks for."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq

LANGS = ["en", "en", "de", "fr", "de", "fr", "en", "en"]  # row group g's language
ROWS = 250  # per row group; row group g holds ids 250*g .. 250*g + 249
EN_IDS = [ROWS * g + r for g, lang in enumerate(LANGS) if lang == "en" for r in range(ROWS)]


def write_langs(where, filesystem=None) -> None:
    """8 row groups of 250 rows: ``id``, ``lang`` and ``big`` (1000 random bytes a row: ~250 KiB per row
    group, almost all of the file)."""
    ids = list(range(len(LANGS) * ROWS))
    table = pa.table({"id": ids, "lang": [LANGS[i // ROWS] for i in ids], "big": [os.urandom(1000) for _ in ids]})
    pq.write_table(table, where, row_group_size=ROWS, filesystem=filesystem)
