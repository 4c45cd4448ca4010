"""Retrieved passages and their prompt formatting (Search-R1's `Doc i(Title: t) text` lines)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Document:
    """One retrieved passage as the server sent it: wiki-18 `contents` is the quoted title, a newline,
    then the text (the released clients put it in their prompts verbatim); `score` is None when the
    server did not send one."""

    id: str
    contents: str
    score: float | None = None

    @property
    def title(self) -> str:
        """The first line of `contents`, without the one pair of quotes around it (if any)."""
        line = self.contents.partition("\n")[0]
        return line[1:-1] if len(line) >= 2 and line[0] == line[-1] == '"' else line

    @property
    def text(self) -> str:
        """`contents` after its first line."""
        return self.contents.partition("\n")[2]


def document_from_json(item: Mapping[str, Any]) -> Document:
    """Parse one result item of either API shape.

    Search-R1 sends `{"document": {...}, "score": s}` (or the bare document when scores are off);
    a document holds `id` plus either `contents` or `title` and `text` (then laid out as wiki-18's).
    """
    doc = item.get("document", item)
    score = item.get("score", doc.get("score"))
    contents = doc["contents"] if "contents" in doc else f'"{doc["title"]}"\n{doc["text"]}'
    return Document(id=str(doc["id"]), contents=contents, score=None if score is None else float(score))


def format_documents(docs: Sequence[Document]) -> str:
    """The Search-R1 prompt block: `Doc 1(Title: t) text` lines joined by newlines."""
    return "\n".join(f"Doc {i}(Title: {doc.title}) {doc.text}" for i, doc in enumerate(docs, start=1))
