"""dig: one value out of nested JSON, by a dotted path or a list of keys."""

import pytest

from evalsite.jsonpaths import dig

DOCUMENT = {
    "outputs": {"items": [{"name": "Paris"}, {"name": "Rome"}], "score": 0, "note": None},
    "a.b": "a key with a dot",
}
MISSING = object()


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("outputs.items.1.name", "Rome"),
        (["outputs", "items", "1", "name"], "Rome"),
        (("outputs", "items", 0, "name"), "Paris"),
        ("outputs.score", 0),
        (["a.b"], "a key with a dot"),
    ],
)
def test_it_follows_keys_and_list_indexes(path, expected):
    assert dig(DOCUMENT, path) == expected


def test_it_returns_the_value_itself_for_an_empty_path():
    assert dig(DOCUMENT, "") is DOCUMENT
    assert dig(DOCUMENT, []) is DOCUMENT


@pytest.mark.parametrize(
    "path",
    [
        "outputs.nope",
        "outputs.items.2.name",
        "outputs.items.-1.name",
        "outputs.items.name",
        "outputs.score.value",
        "a.b",
        ["outputs", "items", True],
    ],
)
def test_it_returns_none_when_the_path_is_missing(path):
    assert dig(DOCUMENT, path) is None


def test_it_tells_a_missing_value_from_a_null_with_a_default():
    assert dig(DOCUMENT, "outputs.note", default=MISSING) is None
    assert dig(DOCUMENT, "outputs.absent", default=MISSING) is MISSING


def test_it_reads_nothing_out_of_a_scalar():
    assert dig("text", "0") is None
    assert dig(None, "a") is None
