"""Reading one byte range of a line-based file (text, CSV, JSON Lines) on an executor.

A large line-based file is split into byte ranges of about ``max_partition_bytes``
without reading it (the ranges are arithmetic on its size), so a boundary usually
falls inside a line. The rule that makes the ranges hold every line exactly once is
Hadoop's ``LineRecordReader``'s, which Spark's text sources use: **a line belongs to
the range that holds its first byte.** A range that does not start at 0 skips the
line it starts inside (its previous range reads it to its end), and reads past its
own end to finish its last line. A line is cut at ``\\n`` only, so ``\\r\\n`` ends are
never split and the lines of all ranges, concatenated, are the file's bytes.
"""

from __future__ import annotations

_CHUNK = 1 << 20  # how far a range reads at a time while it looks for a line's end


def read_line_range(handle, start: int, stop: int) -> bytes:
    """The bytes of every line that starts in ``[start, stop)`` of the open file ``handle``.

    ``handle`` is a seekable file (`pyarrow.NativeFile`), left positioned right after the
    bytes returned (at the file's end exactly when the range holds its last line). A range
    inside one long line holds no line start and returns ``b""``; so does a range past the
    end of the file.
    """
    if start >= stop:
        return b""
    begin = 0
    if start > 0:
        handle.seek(start - 1)  # a line starts at ``start`` exactly when the byte before it ends one
        skipped = _through_newline(handle)
        if skipped is None:
            return b""
        begin = start - 1 + len(skipped)
        if begin >= stop:
            return b""
    handle.seek(begin)
    data = handle.read(stop - begin)
    if len(data) < stop - begin or data.endswith(b"\n"):
        return data  # the end of the file, or a line ends exactly at ``stop``: the next range starts there
    data += _through_newline(handle) or b""
    handle.seek(begin + len(data))  # it read ahead in chunks while looking for the line's end
    return data


def _through_newline(handle) -> bytes | None:
    """Read through the next ``\\n`` (inclusive); what was read up to the end if there is none, or
    None when the file ended first with nothing read."""
    pieces = []
    while True:
        piece = handle.read(_CHUNK)
        if not piece:
            return b"".join(pieces) if pieces else None
        end = piece.find(b"\n")
        if end >= 0:
            pieces.append(piece[:end + 1])
            return b"".join(pieces)
        pieces.append(piece)


def first_line(handle) -> bytes:
    """The file's first line with its ``\\n`` (a CSV header, which every range of the file parses with)."""
    handle.seek(0)
    return _through_newline(handle) or b""
