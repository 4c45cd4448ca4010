"""Parsing both result shapes and the Search-R1 prompt format, against hand-written values."""

from verl_memagent.search import Document, format_documents
from verl_memagent.search.documents import document_from_json, split_contents


def test_split_contents_strips_title_quotes_and_keeps_text_lines():
    contents = '"Evan Morris"\nEvan L. Morris was\na lobbyist.'
    assert split_contents(contents) == ("Evan Morris", "Evan L. Morris was\na lobbyist.")
    assert split_contents("No title line") == ("No title line", "")


def test_document_from_search_r1_item_with_and_without_score():
    item = {"document": {"id": 7, "contents": '"T"\nbody'}, "score": 0.5}
    assert document_from_json(item) == Document(id="7", title="T", text="body", score=0.5)
    assert document_from_json({"id": "7", "contents": '"T"\nbody'}) == Document(id="7", title="T", text="body")


def test_document_from_title_text_shape():
    assert document_from_json({"id": "1", "title": "A", "text": "b", "score": 2}) == Document("1", "A", "b", 2.0)


def test_format_documents_numbers_from_one():
    docs = [Document("1", "Alpha", "first text"), Document("2", "Beta", "second text", 0.3)]
    assert format_documents(docs) == "Doc 1(Title: Alpha) first text\nDoc 2(Title: Beta) second text"
    assert format_documents([]) == ""
