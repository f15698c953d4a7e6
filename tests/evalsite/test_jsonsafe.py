"""evalsite.jsonsafe: parsed by orjson, the depth read off the text's brackets; whatever orjson
refuses or would change goes to the standard library, as before."""

from __future__ import annotations

import json
import random

import pytest

from evalsite.jsonsafe import MAX_DEPTH, UnsafeJSON, depth_exceeds, loads


def nested(levels: int, inner: str = "1") -> str:
    # Alternating objects and lists: the depth counts both.
    text = inner
    for level in range(levels):
        text = f'{{"k": {text}}}' if level % 2 else f"[{text}]"
    return text


def test_it_accepts_json_nested_to_the_limit_and_refuses_one_level_more():
    assert loads(nested(MAX_DEPTH)) is not None
    with pytest.raises(UnsafeJSON, match=f"nested deeper than {MAX_DEPTH} levels"):
        loads(nested(MAX_DEPTH + 1))
    with pytest.raises(UnsafeJSON, match="nested deeper"):
        loads(nested(MAX_DEPTH + 1).encode())


def test_brackets_inside_strings_do_not_count():
    text = json.dumps({"note": "[" * 500 + "{" * 500, "list": ["]]]", "[[["]})
    assert loads(text)["note"].startswith("[[[")


def test_escaped_quotes_and_backslashes_do_not_hide_real_nesting():
    # A string ending in an escaped backslash, then an escaped quote: the brackets after each
    # are structure, not text.
    for inner in ('"a\\\\"', '"say \\"hi\\""', '"\\\\\\""'):
        deep = nested(MAX_DEPTH, inner)
        assert loads(deep) is not None
        with pytest.raises(UnsafeJSON, match="nested deeper"):
            loads(nested(MAX_DEPTH + 1, inner))


def test_it_agrees_with_walking_the_parsed_value():
    rng = random.Random(16)
    pieces = ["[", "]", "{", "}", '"', "\\", "a", "\n", "é"]

    def value(depth: int):
        roll = rng.random()
        if depth == 0 or roll < 0.3:
            return "".join(rng.choice(pieces) for _ in range(rng.randint(0, 5)))
        if roll < 0.65:
            return [value(depth - 1) for _ in range(rng.randint(0, 3))]
        return {f"k{i}": value(depth - 1) for i in range(rng.randint(0, 3))}

    for _ in range(2000):
        text = json.dumps(value(rng.randint(0, 9)), ensure_ascii=rng.random() < 0.5)
        for limit in range(0, 10):
            parsed = json.loads(text)
            try:
                loads(text, limit=limit)
                refused = False
            except UnsafeJSON:
                refused = True
            assert refused == depth_exceeds(parsed, limit), (text, limit)


def test_integers_past_64_bits_keep_every_digit():
    assert loads(str(2**70)) == 2**70
    assert loads(f'{{"tokens": {2**64}}}') == {"tokens": 2**64}


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_it_refuses_non_standard_constants_naming_them(constant):
    with pytest.raises(UnsafeJSON, match=f"{constant} is not a JSON value"):
        loads(f'{{"score": {constant}}}')


def test_it_keeps_what_the_standard_library_accepted():
    assert loads('"\\ud800"') == "\ud800"  # a lone surrogate, which orjson refuses
    with pytest.raises(UnsafeJSON, match="Expecting value"):
        loads("[1,")
