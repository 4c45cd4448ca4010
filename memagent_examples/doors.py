"""The doors both example tasks are made of: a made-up station's gate whose password only its own passage states.

`learn_codes` asks for one door's password, `composed_doors` for several at once. Station, gate and
password are words the tokenizer writes as one token after a space (`single_token_words`), so each is
the same single token wherever it appears and keeping one is copying one token.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from retriever_server.bm25 import terms

TASK_WORDS = ("password", "station", "gate")


@dataclass(frozen=True)
class Door:
    """One gate of a made-up station, whose password only its own passage states."""

    station: str
    gate: str
    password: str

    @property
    def name(self) -> str:
        return f"station {self.station} at gate {self.gate}"

    @property
    def statement(self) -> str:
        return f"The password of {self.name} is {self.password}."

    @property
    def passage(self) -> str:
        return f'"station {self.station} gate {self.gate}"\n{self.statement}'

    @property
    def question(self) -> str:
        return f"What is the password of {self.name}?"


def single_token_words(tokenizer) -> list[str]:
    """Lower-case words of four letters or more that `tokenizer` writes as one token after a space,
    one per BM25 term (so a query for one finds no other: "seasons" and "season" stem alike), none a
    stop word or one of the task's own words; sorted."""
    words = {token[1:] for token in tokenizer.get_vocab() if token.startswith("Ġ")}
    words = sorted(w for w in words if len(w) >= 4 and w.isascii() and w.isalpha() and w.islower())
    words = [w for w in words if len(tokenizer.encode(" " + w)) == 1]
    taken = {term for (term,) in terms(list(TASK_WORDS))}
    kept = []
    for word, word_terms in zip(words, terms(words), strict=True):
        if len(word_terms) == 1 and word_terms[0] not in taken:
            taken.add(word_terms[0])
            kept.append(word)
    return kept


def write_questions(path: Path, doors: Sequence[Door], prefix: str) -> None:
    """The doors' questions as a FlashRAG file (`id` `prefix-i`, `question`, `golden_answers`)."""
    with path.open("w", encoding="utf-8") as f:
        for i, door in enumerate(doors):
            row = {"id": f"{prefix}-{i}", "question": door.question, "golden_answers": [door.password]}
            f.write(json.dumps(row) + "\n")
