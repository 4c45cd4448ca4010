"""Retrieved passages and their prompt formatting (Search-R1's `Doc i(Title: t) text` lines)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Document:
    """One retrieved passage; `score` is None when the server did not send one."""

    id: str
    title: str
    text: str
    score: float | None = None


def split_contents(contents: str) -> tuple[str, str]:
    """Split wiki-18 `contents` into (title, text): the title is the first line without its quotes."""
    title, _, text = contents.partition("\n")
    return title.strip().strip('"'), text


def document_from_json(item: Mapping[str, Any]) -> Document:
    """Parse one result item of either API shape.

    Search-R1 sends `{"document": {...}, "score": s}` (or the bare document when scores are off);
    a document holds `id` plus either `contents` or `title` and `text`.
    """
    doc = item.get("document", item)
    score = item.get("score", doc.get("score"))
    if "contents" in doc:
        title, text = split_contents(doc["contents"])
    else:
        title, text = doc["title"], doc["text"]
    return Document(id=str(doc["id"]), title=title, text=text, score=None if score is None else float(score))


def format_documents(docs: Sequence[Document]) -> str:
    """The Search-R1 prompt block: `Doc 1(Title: t) text` lines joined by newlines."""
    return "\n".join(f"Doc {i}(Title: {doc.title}) {doc.text}" for i, doc in enumerate(docs, start=1))
