"""Passage store: every passage's id and contents in one memory-mapped byte buffer.

Layout in `<dir>/`: `data.bin` holds, row after row, the UTF-8 id followed by the UTF-8 contents
(`"Title"\\ntext`, the wiki-18 form); `offsets.npy` (int64, 2n+1 entries) holds the field boundaries,
so row i is `data[o[2i]:o[2i+1]]` (id) and `data[o[2i+1]:o[2i+2]]` (contents). Lookup is O(1), and
no Python object exists per passage, so 21M passages cost their bytes on disk and nothing in RAM
until touched.
"""

from __future__ import annotations

import json
import mmap
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

DATA_FILE = "data.bin"
OFFSETS_FILE = "offsets.npy"


class CorpusError(ValueError):
    """A corpus file or store that cannot be read; the message names the file (and line)."""


def parse_line(line: str | bytes, path: Path | str, lineno: int) -> tuple[str, str]:
    """One JSON line -> (id, contents); accepts `{"id", "contents"}` and `{"id", "title", "text"}`."""
    where = f"{path}:{lineno}"
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise CorpusError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    except UnicodeDecodeError as exc:
        raise CorpusError(f"{where}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    if not isinstance(row, dict) or "id" not in row:
        raise CorpusError(f'{where}: expected an object with "id" and "contents" (or "title" and "text")')
    doc_id = row["id"]
    if not isinstance(doc_id, str | int) or isinstance(doc_id, bool):
        raise CorpusError(f'{where}: "id" must be a string or an integer, got {type(doc_id).__name__}')
    if isinstance(row.get("contents"), str):
        return str(doc_id), row["contents"]
    title, text = row.get("title"), row.get("text")
    if isinstance(title, str) and isinstance(text, str):
        return str(doc_id), f'"{title}"\n{text}'
    raise CorpusError(f'{where}: needs a string "contents", or string "title" and "text"')


def iter_jsonl(path: Path | str, read: Callable[[int], None] = lambda size: None) -> Iterator[tuple[str, str]]:
    """Yield (id, contents) for each non-blank line of a JSON-lines corpus; `read(size)` is told the
    bytes of each line read (for progress: the file's size is known before its passage count)."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"{path}: corpus file not found")
    with path.open("rb") as handle:
        for lineno, line in enumerate(handle, start=1):
            read(len(line))
            if line.strip():
                yield parse_line(line, path, lineno)


def build_store(corpus_path: Path | str, out_dir: Path | str, *, read: Callable[[int], None] = lambda n: None) -> int:
    """Convert a JSON-lines corpus into the store layout in `out_dir`; returns the passage count.
    `read(size)` is told the corpus bytes read as it goes."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    offsets = array("q", [0])
    position = 0
    with (out_dir / DATA_FILE).open("wb") as data:
        for doc_id, contents in iter_jsonl(corpus_path, read):
            for field in (doc_id.encode(), contents.encode()):
                data.write(field)
                position += len(field)
                offsets.append(position)
    if len(offsets) == 1:
        raise CorpusError(f"{corpus_path}: corpus holds no passages")
    np.save(out_dir / OFFSETS_FILE, np.frombuffer(offsets, dtype=np.int64))
    return (len(offsets) - 1) // 2


class CorpusStore:
    """Read-only, memory-mapped view of a store written by `build_store`."""

    def __init__(self, store_dir: Path | str):
        store_dir = Path(store_dir)
        data_path, offsets_path = store_dir / DATA_FILE, store_dir / OFFSETS_FILE
        for path in (data_path, offsets_path):
            if not path.is_file():
                raise CorpusError(f"{path}: missing; rebuild with `python -m retriever_server build`")
        try:
            self._offsets = np.load(offsets_path, mmap_mode="r")
        except (ValueError, OSError) as exc:
            raise CorpusError(f"{offsets_path}: unreadable ({exc})") from None
        size = data_path.stat().st_size
        if self._offsets.ndim != 1 or len(self._offsets) % 2 != 1 or int(self._offsets[-1]) != size:
            raise CorpusError(f"{store_dir}: offsets do not match {DATA_FILE} (truncated or corrupt store)")
        self._offsets = np.asarray(self._offsets)  # still mapped; a plain array indexes many times faster
        self._data: mmap.mmap | bytes = b""  # slices of an mmap are bytes: no numpy object per field
        if size:
            with data_path.open("rb") as data:
                self._data = mmap.mmap(data.fileno(), 0, access=mmap.ACCESS_READ)

    def __len__(self) -> int:
        return (len(self._offsets) - 1) // 2

    def _field(self, index: int) -> str:
        start, end = self._offsets[index : index + 2].tolist()
        return self._data[start:end].decode("utf-8")

    def doc_id(self, row: int) -> str:
        return self._field(2 * row)

    def contents(self, row: int) -> str:
        return self._field(2 * row + 1)

    def read(self, rows: list[int]) -> list[tuple[str, str]]:
        """(id, contents) of each row: the offsets of all rows looked up at once, for answers of many
        passages (several times faster than a row at a time)."""
        first = 2 * np.asarray(rows, dtype=np.int64)
        bounds = np.stack([self._offsets[first], self._offsets[first + 1], self._offsets[first + 2]], axis=1)
        data = self._data
        return [(data[a:b].decode("utf-8"), data[b:c].decode("utf-8")) for a, b, c in bounds.tolist()]

    def iter_contents(self, start: int = 0, stop: int | None = None) -> Iterator[str]:
        """Contents of rows [start, stop), for index builds."""
        for row in range(start, len(self) if stop is None else stop):
            yield self.contents(row)
