"""A result's fields: dotted paths that name one leaf each, and a walk bounded for hostile values."""

from hypothesis import given, strategies as st

from tensorjob_jupyter.host.fields import field_path, result_fields, split_path


def test_leaves_are_named_by_keys_and_indices_in_document_order():
    value = {"title": "Bridge", "facts": {"authors": ["Ada", "Grace"], "year": 1998}, "ok": True, "none": None}
    assert list(result_fields(value)) == [
        ("title", "Bridge"), ("facts.authors.0", "Ada"), ("facts.authors.1", "Grace"), ("facts.year", 1998),
        ("ok", True), ("none", None)]


def test_a_scalar_result_is_one_field_with_the_empty_path_and_empty_containers_have_none():
    assert list(result_fields("just text")) == [("", "just text")]
    assert list(result_fields({"a": {}, "b": []})) == []


def test_a_key_with_a_dot_or_backslash_is_escaped_so_the_path_names_one_leaf():
    paths = [p for p, _ in result_fields({"a.b": 1, "a": {"b": 2}, "c\\": 3})]
    assert paths == ["a\\.b", "a.b", "c\\\\"]
    assert [split_path(p) for p in paths] == [["a.b"], ["a", "b"], ["c\\"]]


def test_the_walk_stops_at_its_limit_and_survives_deep_nesting():
    deep: object = "leaf"
    for _ in range(100_000):
        deep = [deep]
    assert list(result_fields(deep)) == [(".".join(["0"] * 100_000), "leaf")]
    assert len(list(result_fields(list(range(5000)), limit=10))) == 10


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20)


@given(json_values)
def test_every_path_splits_back_into_the_keys_that_reach_its_leaf(value):
    for path, leaf in result_fields(value):
        node = value
        for part in split_path(path) if isinstance(value, (dict, list)) else []:
            node = node[int(part)] if isinstance(node, list) else node[part]
        assert node == leaf


@given(st.lists(st.one_of(st.text(), st.integers(min_value=0)), max_size=6))
def test_field_path_and_split_path_are_inverse_for_keys(parts):
    parts = tuple(parts)
    if not parts:
        return
    assert split_path(field_path(parts)) == [str(p) for p in parts]


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner,
                                                                                        max_size=4), max_leaves=20)


@given(json_values)
def test_every_field_path_names_its_own_leaf(value):
    from tensorjob_jupyter.host.fields import value_at

    for path, leaf in result_fields(value):
        if path != "" or not isinstance(value, (dict, list)):  # "" is the root (a key "" shares the path)
            assert value_at(value, path) == leaf


def test_a_path_that_names_nothing_is_missing():
    from tensorjob_jupyter.host.fields import MISSING, value_at

    doc = {"a": [1, {"b": 2}], "c.d": 3}
    assert value_at(doc, "a.1.b") == 2 and value_at(doc, "c\\.d") == 3 and value_at(doc, "") is doc
    assert all(value_at(doc, p) is MISSING for p in ("x", "a.2", "a.b", "a.1.b.c", "c.d"))
    assert value_at([1, 2, 3], "²") is MISSING and value_at([1], "١") is MISSING  # digits, but not indices
