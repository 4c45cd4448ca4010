"""Parsing both result shapes and the Search-R1 prompt format, against hand-written values."""

from verl_memagent.search import Document, format_documents
from verl_memagent.search.documents import document_from_json


def test_title_and_text_come_from_the_verbatim_contents():
    doc = Document("1", '"Evan Morris"\nEvan L. Morris was\na lobbyist.')
    assert (doc.title, doc.text) == ("Evan Morris", "Evan L. Morris was\na lobbyist.")
    assert Document("2", "No title line").title == "No title line" and Document("2", "No title line").text == ""
    # one pair of quotes goes, the title's own quotes stay (wiki-18: `""Heroes" (song)"`)
    quoted = Document("3", '""Heroes" (song)"\nA song.')
    assert quoted.title == '"Heroes" (song)' and quoted.contents == '""Heroes" (song)"\nA song.'


def test_document_from_search_r1_item_with_and_without_score():
    item = {"document": {"id": 7, "contents": '"T"\nbody'}, "score": 0.5}
    assert document_from_json(item) == Document(id="7", contents='"T"\nbody', score=0.5)
    assert document_from_json({"id": "7", "contents": '"T"\nbody'}) == Document(id="7", contents='"T"\nbody')


def test_document_from_title_text_shape():
    assert document_from_json({"id": "1", "title": "A", "text": "b", "score": 2}) == Document("1", '"A"\nb', 2.0)


def test_format_documents_numbers_from_one():
    docs = [Document("1", '"Alpha"\nfirst text'), Document("2", '"Beta"\nsecond text', 0.3)]
    assert format_documents(docs) == "Doc 1(Title: Alpha) first text\nDoc 2(Title: Beta) second text"
    assert format_documents([]) == ""
