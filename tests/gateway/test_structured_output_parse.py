"""gateway.structured_output: every accepted shape becomes the right StructuredSpec, and
any other value is a 400 naming its field (never an exception of another type)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.structured.spec import StructuredSpec
from gateway.errors import InvalidParameterError
from gateway.structured_output import STRUCTURED_FIELDS, structured_spec

SCHEMA = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}
COMPACT = json.dumps(SCHEMA, separators=(",", ":"))


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({}, None),
        ({"response_format": {"type": "text"}}, None),
        (
            {"response_format": {"type": "json_object"}},
            (StructuredSpec("json_object"), "response_format"),
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": SCHEMA, "strict": True},
                }
            },
            (StructuredSpec("json_schema", COMPACT), "response_format"),
        ),
        ({"guided_json": SCHEMA}, (StructuredSpec("json_schema", COMPACT), "guided_json")),
        (
            {"guided_json": json.dumps(SCHEMA)},
            (StructuredSpec("json_schema", COMPACT), "guided_json"),
        ),
        ({"guided_regex": "a+"}, (StructuredSpec("regex", "a+"), "guided_regex")),
        ({"guided_choice": ["x", "y"]}, (StructuredSpec("choice", '["x", "y"]'), "guided_choice")),
        (
            {"guided_grammar": 'start: "a"'},
            (StructuredSpec("lark", 'start: "a"'), "guided_grammar"),
        ),
        (
            {"structured_outputs": {"json": SCHEMA}},
            (StructuredSpec("json_schema", COMPACT), "structured_outputs"),
        ),
        (
            {"structured_outputs": {"regex": "b"}},
            (StructuredSpec("regex", "b"), "structured_outputs"),
        ),
        (
            {"structured_outputs": {"choice": ["q"]}},
            (StructuredSpec("choice", '["q"]'), "structured_outputs"),
        ),
        (
            {"structured_outputs": {"grammar": 'start: "z"'}},
            (StructuredSpec("lark", 'start: "z"'), "structured_outputs"),
        ),
        (
            {"structured_outputs": {"json_object": True}},
            (StructuredSpec("json_object"), "structured_outputs"),
        ),
    ],
)
def test_accepted_shapes(
    extra: dict[str, Any], expected: tuple[StructuredSpec, str] | None
) -> None:
    assert structured_spec(extra) == expected


def test_property_order_is_kept() -> None:
    found = structured_spec({"guided_json": SCHEMA})
    assert found is not None
    assert list(json.loads(found[0].value)["properties"]) == ["b", "a"]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"response_format": "json"}, "response_format"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        ({"guided_json": "{not json"}, "guided_json"),
        ({"guided_json": [1, 2]}, "guided_json"),
        ({"guided_regex": ""}, "guided_regex"),
        ({"guided_choice": []}, "guided_choice"),
        ({"guided_choice": ["ok", 3]}, "guided_choice"),
        ({"structured_outputs": {"json": SCHEMA, "regex": "a"}}, "structured_outputs"),
        ({"structured_outputs": {"xml": "a"}}, "structured_outputs"),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
        ({"guided_regex": "a" * 70_000}, "guided_regex"),
    ],
)
def test_refused_shapes_name_their_field(extra: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidParameterError) as caught:
        structured_spec(extra)
    assert caught.value.param == param and caught.value.status == 400


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(STRUCTURED_FIELDS),
        JSON
        | st.fixed_dictionaries(
            {"type": st.sampled_from(["text", "json_object", "json_schema", "x"])}
        ),
        max_size=2,
    )
)
def test_any_value_is_a_spec_none_or_a_400(extra: dict[str, Any]) -> None:
    try:
        found = structured_spec(extra)
    except InvalidParameterError as exc:
        assert exc.param in STRUCTURED_FIELDS
    else:
        assert found is None or isinstance(found[0], StructuredSpec)
