"""The locator (host/grounding.py) and what a job read (host/windows.py): matches, offsets, bounds.

Unit rows for each kind of match, then Hypothesis properties that look for results and windows that break it:
a value that is in a window is found exact at its offsets; every span lies in what was read and decodes to
its value; the budgets are never exceeded; any Unicode, repeated and overlapping values, huge numbers.
"""

import json

import pytest
from hypothesis import example, given, strategies as st

from tensorjob_jupyter import abi
from tensorjob_jupyter.abi import codes
from tensorjob_jupyter.host import grounding, spellings
from tensorjob_jupyter.host.grounding import Bounds, canonical, locate, sources_label
from tensorjob_jupyter.host.requirements import require_grounded
from tensorjob_jupyter.host.windows import Place, ReadWindows, Segment

FILE = Place(file="/docs/a.txt")


def seg(text: str | bytes, start: int = 0, place: Place = FILE) -> Segment:
    return Segment(place, start, text.encode("utf-8") if isinstance(text, str) else text)


def one(value, *segments, **kw):
    return locate({"v": value}, list(segments), **kw).get("v")


# --- each kind of match --------------------------------------------------------------------------------


def test_an_exact_value_has_its_byte_offsets_in_the_file():
    text = "Preface. Invoice from ACME Corp. Total due."
    [source] = one("ACME Corp", seg(text, start=1000))
    assert source == {"file": "/docs/a.txt", "url": None, "page": None, "start": 1000 + text.index("ACME"),
                      "end": 1000 + text.index("ACME") + 9, "match": "exact", "score": 1.0,
                      "label": "Invoice from", "under": None, "elsewhere": False}


def test_offsets_count_bytes_not_characters():
    text = "Ünïcödé first, then Zoë Ångström."
    [source] = one("Zoë Ångström", seg(text))
    data = text.encode()
    assert data[source["start"]:source["end"]].decode() == "Zoë Ångström"


@pytest.mark.parametrize("value, text, span", [
    ("acme corp", "Invoice from ACME  Corp today", "ACME  Corp"),
    ("ﬁnance", "the finance team", "finance"),  # NFKC: the ligature is f + i
    ("STRASSE", "in der Straße 5", "Straße"),  # case-folded
    (1234567, "a total of 1,234,567 units", "1,234,567"),
    (1234567, "a total of 1 234 567 units", "1 234 567"),
    (42.0, "about 42 items", "42"),
    (1e21, "1,000,000,000,000,000,000,000 atoms", "1,000,000,000,000,000,000,000"),
    ("2024-03-05", "signed on March 5, 2024 in Paris", "March 5, 2024"),
    ("2024-03-05", "signed on 5th March 2024 in Paris", "5th March 2024"),
    ("hello world", "HELLO\n\tWORLD", "HELLO\n\tWORLD"),
])
def test_a_normalised_value_is_found_with_the_span_it_came_from(value, text, span):
    [source] = one(value, seg(text))
    assert source["match"] == "normalised"
    assert text.encode()[source["start"]:source["end"]].decode() == span


def test_a_rephrased_value_is_found_fuzzy_with_its_score():
    text = "The customer writes that the Widget Pro 3000 stopped charging after a week."
    [source] = one("the widget pro 300 stoped charging", seg(text))
    assert source["match"] == "fuzzy" and 0.9 <= source["score"] < 1
    assert "Widget Pro 3000" in text.encode()[source["start"]:source["end"]].decode()


def test_a_planted_value_is_found_nowhere():
    assert one("The product named, or null,", seg("Hi, my kettle is broken. Regards, Ann")) == []


def test_a_number_is_not_found_inside_a_longer_number():
    assert one(12, seg("in 2012 and 3.12 and 1,12")) == []
    [source] = one(12, seg("in 2012 we had 12 of them"))
    assert source["start"] == len("in 2012 we had ")


@pytest.mark.parametrize("value, text", [
    ("12", "since 2012"), ("Smit", "signed by Smith"), (True, "that is untrue"), (True, "as construed"),
    (False, "a falsehood"), ("1", "costs 12.99"), ("cat", "concatenate"),
])
def test_text_inside_a_word_is_never_a_source(value, text):
    assert one(value, seg(text)) == []
    assert one(value, seg(text + " and " + abi.dumps(value).strip('"')))[0]["match"] == "exact"


def test_a_minus_before_a_number_is_its_sign_but_a_dash_between_two_is_not():
    assert one(5, seg("a change of -5 points")) == []
    assert one(5, seg("a change of \u22125 points")) == []
    assert one(-5, seg("a change of -5 points"))[0]["match"] == "exact"
    assert one(5, seg("pages 3-5"))[0]["match"] == "exact"
    assert one(5, seg("item A-5"))[0]["match"] == "exact"


@pytest.mark.parametrize("text", ["signed 05/03/2024", "signed 05-03-2024"])
def test_a_numeric_date_that_reads_as_two_days_grounds_neither(text):
    for value in ("2024-03-05", "2024-05-03"):
        [source] = one(value, seg(text))
        assert (source["match"], source["score"]) == ("ambiguous", grounding.AMBIGUOUS_SCORE)
        assert grounding.grounds([source]) is False
    assert one("2024-03-05", seg("signed 05.03.2024"))[0]["match"] == "normalised"  # dots: the day first
    assert one("2024-03-25", seg("signed 25/03/2024"))[0]["match"] == "normalised"  # no month 25
    assert one("2024-03-03", seg("signed 03/03/2024"))[0]["match"] == "normalised"  # either way the same day


@pytest.mark.parametrize("value, text", [
    ("DE44 5001 0517 5407 3249 31", "IBAN DE44 5001 0517 5407 3249 32 please"),
    ("www.paypa1-secure.com", "log in at www.paypal-secure.com today"),
    ("ceo@acme-c0rp.com", "write to ceo@acme-corp.com"),
    ("Total due 1,234.57 EUR", "Total due 1,234.56 EUR"),
])
def test_a_one_character_forgery_is_at_best_fuzzy_and_never_grounds(value, text):
    sources = one(value, seg(text))
    assert all(s["match"] == "fuzzy" for s in sources) and grounding.grounds(sources) is False
    with pytest.raises(abi.JobFailure) as e:
        require_grounded({"v": value}, {"v": sources}, ["v"]) if sources else require_grounded(
            {"v": value}, {"v": []}, ["v"])
    assert e.value.code == codes.UNGROUNDED


def test_a_fuzzy_match_fails_require_grounded_and_says_so():
    text = "The customer writes that the Widget Pro 3000 stopped charging after a week."
    result = {"v": "the widget pro 300 stoped charging"}
    with pytest.raises(abi.JobFailure) as e:
        require_grounded(result, locate(result, [seg(text)]), ["v"])
    assert "only a fuzzy match" in e.value.message


def test_an_array_of_more_values_than_are_checked_fails_require_grounded():
    values = [f"v{i}" for i in range(1500)]
    text = " ".join(values[:1000])
    result = {"items": values}
    unhurried = lambda: 0.0  # noqa: E731 - the count is what is tested, not the seconds a loaded machine takes
    sources = locate(result, [seg(text)], clock=unhurried)
    with pytest.raises(abi.JobFailure) as e:
        require_grounded(result, sources, ["items"])
    assert e.value.code == codes.UNGROUNDED and "more than 1000 values" in e.value.message
    require_grounded({"items": values[:1000]}, locate({"items": values[:1000]}, [seg(text)], clock=unhurried),
                     ["items"])


def test_a_fetched_body_that_repeats_the_url_grounds_nothing_the_guest_wrote_there():
    echo = Place(url="https://example.org/search?q=ACME%20Holdings%20Ltd", fetch=3)
    body = seg("Results for ACME Holdings Ltd: none. Price 42.", place=echo)
    assert one("ACME Holdings Ltd", body) == []
    assert one("acme holdings", body) == []
    assert one(42, body)[0]["url"] == echo.url  # what the guest did not write is evidence still


def test_booleans_are_words_and_null_or_blank_is_no_claim():
    found = locate({"a": True, "b": None, "c": "  ", "d": False}, [seg("it is true")])
    assert found["a"][0]["match"] == "exact" and found["d"] == []
    assert "b" not in found and "c" not in found


def test_array_fields_have_dotted_paths_and_sources_come_best_first():
    found = locate({"facts": {"authors": ["Ann Lee", "Bo Ng"]}}, [seg("by Ann Lee and bo ng; Ann Lee again")])
    assert [s["match"] for s in found["facts.authors.0"]] == ["exact", "exact"]
    assert found["facts.authors.1"][0]["match"] == "normalised"


def test_a_value_cut_by_consecutive_windows_is_found_whole():
    windows = ReadWindows()
    windows._keep(FILE, 0, b"the total is 1,2")
    windows._keep(FILE, 16, b"34 units")
    windows._keep(FILE, 4, b"total")  # read twice: searched once
    [segment] = windows.segments()
    assert segment.data == b"the total is 1,234 units"
    [source] = locate({"n": 1234}, windows.segments())["n"]
    assert (source["start"], source["end"]) == (13, 18)


def test_slice_bytes_that_cut_a_character_are_searched_around_it():
    data = "é".encode()[1:] + "price: 40 €".encode() + b"\xff\xfe" + "Zoë".encode() + "é".encode()[:1]
    found = locate({"p": 40, "z": "Zoë"}, [seg(data, start=7)])
    assert data[found["p"][0]["start"] - 7:found["p"][0]["end"] - 7] == b"40"
    assert data[found["z"][0]["start"] - 7:found["z"][0]["end"] - 7] == "Zoë".encode()


def test_pages_and_urls_are_places_of_their_own():
    page = Place(file="/docs/r.pdf", page=3)
    url = Place(url="https://example.org/a")
    found = locate({"a": "alpha", "b": "beta"}, [seg("alpha", place=page), seg("x beta", place=url)])
    assert found["a"][0]["page"] == 3 and found["a"][0]["file"] == "/docs/r.pdf"
    assert found["b"][0]["url"] == "https://example.org/a" and found["b"][0]["file"] is None
    assert sources_label(found["a"]) == "r.pdf#3:0-5" and sources_label([]) == "" and sources_label(None) is None


# --- bounds -------------------------------------------------------------------------------------------


def test_a_spent_budget_leaves_the_field_out_not_found_nowhere():
    bounds = Bounds(exact_budget_bytes=10)
    assert locate({"v": "x"}, [seg("a" * 100)], bounds=bounds) == {}


def test_required_fields_are_searched_first_so_the_bounds_reach_them():
    result = {f"k{i}": f"value {i}" for i in range(50)}
    found = locate(result, [seg("value 49")], first=["k49"], bounds=Bounds(max_fields=50, exact_budget_bytes=8))
    assert list(found) == ["k49"] and found["k49"][0]["match"] == "exact"


def test_the_sources_of_a_deep_result_stay_within_their_byte_bound():
    deep = 0
    for _ in range(200):
        deep = [deep] * 3
    found = locate(deep, [seg("0")], bounds=Bounds(max_sources_bytes=4096))
    assert 0 < len(abi.dumps(found).encode()) <= 4096


def test_read_windows_keep_at_most_their_bound():
    windows = ReadWindows(max_kept_bytes=10)
    windows._keep(FILE, 0, b"12345678")
    windows._keep(FILE, 8, b"abcdef")
    assert (windows.kept, windows.dropped) == (8, 6)
    assert [s.data for s in windows.segments()] == [b"12345678"]


# --- the right place: the label a value stands under ---------------------------------------------------------

INVOICE = """ACME Supplies Ltd
Invoice number: INV-2024-017
Invoice date: 2024-04-02
Due date:
2024-05-02
Bill to: Oakley Legal Partners LLP
Subtotal: 1,000.00
Total due: 1,190.00
"""


@pytest.mark.parametrize("field, wrong, label, names", [
    ("vendor", "Oakley Legal Partners LLP", "Bill to:", "customer"),
    ("due_date", "2024-04-02", "Invoice date:", "invoice_date"),
    ("total", 1000, "Subtotal:", "subtotal"),
])
def test_a_value_found_only_under_another_field_s_label_is_elsewhere_and_grounds_nothing(field, wrong, label, names):
    found = locate({field: wrong, "invoice_number": "INV-2024-017"}, [seg(INVOICE)])
    [source] = found[field]
    assert (source["label"], source["under"], source["elsewhere"]) == (label, names, True)
    assert grounding.grounds(found[field]) is False and grounding.grounds(found["invoice_number"]) is True
    with pytest.raises(abi.JobFailure) as e:
        require_grounded({field: wrong}, {field: found[field]}, [field])
    assert "only under a label that names another field" in e.value.message


def test_the_right_value_stands_under_its_own_label_even_on_the_line_above():
    found = locate({"due_date": "2024-05-02", "total_due": 1190, "date": "2024-04-02"}, [seg(INVOICE)])
    assert [(s["label"], s["elsewhere"]) for s in found["due_date"]] == [("Due date:", False)]
    assert found["total_due"][0]["under"] == "total" and grounding.grounds(found["total_due"])
    assert grounding.grounds(found["date"]), "a field named date is at home under Invoice date"


def test_a_value_under_several_labels_lists_its_own_first():
    text = "Bill to: ACME Corp\nVendor: ACME Corp\n"
    # a field of no common kind ("v") is at home under any label: the labels are kept, in document order
    assert [(s["under"], s["elsewhere"]) for s in one("ACME Corp", seg(text))] == [("customer", False),
                                                                                   ("vendor", False)]
    found = locate({"vendor": "ACME Corp"}, [seg(text)])["vendor"]
    assert [(s["under"], s["elsewhere"]) for s in found] == [("vendor", False), ("customer", True)]
    assert grounding.grounds(found)


@pytest.mark.parametrize("before, label", [
    ("Order 41234 (kettle), about the invoice order; signed, ", "signed,"),  # prose: the value's own clause
    ("The kettle arrived late. Customer ", "Customer"),
    ("Rechnung Nr. ", "Rechnung Nr."),  # an abbreviation is no clause end: nothing would be left
    ("Refund sent. Rechnung Nr. ", "Rechnung Nr."),
    ("Total incl. VAT: ", "Total incl. VAT:"),
    ("Total excl. shipping: ", "Total excl. shipping:"),  # an abbreviation before a small letter: no clause end
    ("Nr. der Rechnung: ", "Nr. der Rechnung:"),
    ("St. Louis office, customer ", "St. Louis office, customer"),  # a two-letter word before the stop
    ("Invoice date: 1.2. Customer ", "Invoice date: 1.2. Customer"),  # a number's stop ends no clause
])
def test_in_running_text_a_label_is_the_value_s_own_clause(before, label):
    found = locate({"customer": "Ada Okafor", "order": 41234}, [seg(before + "Ada Okafor.")])
    assert found["customer"][0]["label"] == label
    if label == "signed,":  # "order" ends the clause before: it names nothing of this value
        assert grounding.grounds(found["customer"]) and not found["customer"][0]["elsewhere"]


def test_two_labels_on_one_line_the_one_nearest_the_value_names_it():
    text = "Invoice date: 2024-01-05   Due date: 2024-02-05\n"
    found = locate({"invoice_date": "2024-02-05", "due_date": "2024-01-05"}, [seg(text)])
    assert [(s["under"], s["elsewhere"]) for s in found["invoice_date"]] == [("due_date", True)]
    assert [(s["under"], s["elsewhere"]) for s in found["due_date"]] == [("invoice_date", True)]
    right = locate({"invoice_date": "2024-01-05", "due_date": "2024-02-05"}, [seg(text)])
    assert grounding.grounds(right["invoice_date"]) and grounding.grounds(right["due_date"])


def test_a_negative_number_is_not_found_in_a_range_or_a_code():
    assert one(-5, seg("pages 3-5 and ABC-5")) == []
    assert one(-5, seg("a change of -5 points"))[0]["match"] == "exact"


def test_so_many_places_none_the_value_s_is_not_searched_rather_than_not_found():
    text = " ".join(f"x{i}.5" for i in range(400)) + "\nQuantity: 5\n"
    assert "quantity" not in locate({"quantity": 5}, [seg(text)])  # past max_occurrences: not searched
    assert locate({"quantity": 5}, [seg(text)], bounds=Bounds(max_occurrences=10**4))["quantity"][0]["label"] == \
        "Quantity:"


def test_a_digit_in_the_url_hides_no_one_digit_value_of_the_body():
    body = Place(url="https://example.org/v2/invoices/7731", fetch=1)
    found = locate({"qty": 2, "total": 7, "number": 7731}, [seg("qty: 2, total: 7", place=body)])
    assert found["qty"] and found["total"]
    assert locate({"number": 7731}, [seg("invoice 7731", place=body)])["number"] == []  # the guest wrote it


def test_a_required_field_past_the_thousandth_leaf_is_searched_first():
    result = {"pad": [f"p{i}" for i in range(1000)], "title": "Harbour Bridge"}
    found = locate(result, [seg("The Harbour Bridge report")], first=["title"])
    assert found["title"][0]["match"] == "exact" and list(found)[0] == "title"


# --- the locator inside the job's limits ----------------------------------------------------------------

#: Text whose folded form differs in length from it: ligatures, full-width letters, combining marks, sharp s,
#: a character that folds to 18 (U+FDFA), Hangul jamo that compose.
IRREGULAR = "ﬁﬂﬃＡＢＣßẞe\u0301o\u0308\u0323ǅﷺⅫ\u1100\u1161\u11a8ﾊﾟ"


def test_the_job_check_runs_between_steps_and_its_failure_passes_through():
    text = "".join(IRREGULAR[i % len(IRREGULAR)] for i in range(200_000))
    calls = []

    def check():
        calls.append(1)
        if len(calls) > 20:
            raise abi.JobFailure(codes.CANCELLED, "job cancelled")

    with pytest.raises(abi.JobFailure) as e:
        locate({f"k{i}": f"absent value {i}" for i in range(5)}, [seg(text)], check=check)
    assert e.value.code == codes.CANCELLED and len(calls) == 21


def test_seconds_spent_leave_the_fields_not_searched_never_found():
    ticks = iter(range(10**6))
    text = "x " * 50_000 + "value 3"
    found = locate({f"k{i}": f"value {i}" for i in range(5)}, [seg(text)], bounds=Bounds(max_seconds=3),
                   clock=lambda: next(ticks))
    assert found == {}  # the clock ran out before any field was searched everywhere


def test_a_value_across_a_chunk_cut_in_irregular_text_is_found_with_its_bytes():
    filler = "".join(IRREGULAR[i % len(IRREGULAR)] for i in range(3 * spellings.CHUNK))
    for at in range(spellings.CHUNK - 14, spellings.CHUNK + 2):  # the cut falls in the value and around it
        text = filler[:at] + " Zoë Ångström " + filler[at:]
        [source] = one("ZOË ÅNGSTRÖM", seg(text))
        assert text.encode()[source["start"]:source["end"]].decode() == "Zoë Ångström"


irregular_text = st.text(alphabet=st.sampled_from(IRREGULAR + "ab 1,."), min_size=1, max_size=400)


@given(unit=irregular_text, repeat=st.integers(1, 4000), fields=st.lists(st.text(min_size=1, max_size=40).filter(str.strip), min_size=1, max_size=8))
def test_adversarial_unicode_costs_bounded_memory_and_work(unit, repeat, fields):
    import tracemalloc
    text = (unit * repeat)[:400_000]
    calls = []
    tracemalloc.start()
    try:
        found = locate({f"k{i}": v for i, v in enumerate(fields)}, [seg(text)], check=lambda: calls.append(1),
                       bounds=Bounds(max_seconds=3600))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # the windows' own bytes and their text once decoded, plus a bounded amount a chunk: never the many times
    # the text's size that folding it whole cost
    assert peak < 8 * len(text.encode()) + 16 * 1024 * 1024
    # a field found nowhere was looked for in every chunk, and the job was asked before each
    if any(sources == [] for sources in found.values()):
        assert len(calls) >= len(text) // spellings.MAX_CHUNK


# --- require_grounded -------------------------------------------------------------------------------


@pytest.mark.parametrize("required, message", [
    (["product"], "field `product` = \"Widget\" was found in no window"),
    (["missing"], "the result has no field `missing`"),
    (["facts"], "field `facts.1` = \"Bo\" was found in no window"),
])
def test_a_required_field_found_nowhere_is_ungrounded(required, message):
    result = {"product": "Widget", "none": None, "facts": ["Ann", "Bo"], "ok": "Ann"}
    sources = locate(result, [seg("Ann wrote")])
    with pytest.raises(abi.JobFailure) as e:
        require_grounded(result, sources, required)
    assert e.value.code == codes.UNGROUNDED and message in e.value.message
    require_grounded(result, sources, ["ok", "facts.0", "none"])  # found, or a null that claims nothing


def test_a_field_not_grounded_is_rejected_alone_and_a_null_only_by_require_present():
    from tensorjob_jupyter.host.requirements import Requirements, check_present, ground, rejections

    result = {"product": "Widget", "none": None, "facts": ["Ann", "Bo"], "ok": "Ann"}
    sources = locate(result, [seg("Ann wrote")])
    rejected = rejections(result, sources, ["product", "none", "facts", "ok"])
    assert list(rejected) == ["product", "facts.1"] and "found in no window" in rejected["product"]
    check_present(result, ["product", "facts"])
    with pytest.raises(abi.JobFailure) as e:
        check_present(result, ["none"])
    assert e.value.code == codes.UNGROUNDED and "field `none` of the result is null (require_present)" in e.value.message
    windows = ReadWindows()
    windows._keep(FILE, 0, b"Ann wrote")
    assert ground(result, windows, Requirements(("product",)))[1].keys() == {"product"}
    with pytest.raises(abi.JobFailure) as e:  # rejected, and required present: nothing to keep, the item fails
        ground(result, windows, Requirements(("product",), ("product",)))
    assert "must be present too" in e.value.message


# --- properties -------------------------------------------------------------------------------------------

texts = st.text(min_size=0, max_size=200)
values = st.text(min_size=1, max_size=40).filter(lambda v: v.strip())
scalars = st.one_of(values, st.integers(min_value=-10**30, max_value=10**30), st.booleans(),
                    st.floats(allow_nan=False, allow_infinity=False), st.none())
results = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=6), inner, max_size=4)),
                       max_leaves=20)
binary = st.binary(max_size=300)


def _word_edge(text: str, i: int, j: int) -> bool:
    return not (i > 0 and grounding._is_word(text[i - 1])) and not (j < len(text) and grounding._is_word(text[j]))


@example(before="by ", value="Zoë Ångström", after=", 2024", start=7)
@given(before=texts, value=values, after=texts, start=st.integers(0, 10**12))
def test_a_value_in_a_window_is_always_found_exact_at_its_offsets(before, value, after, start):
    text = before + value + after
    sources = one(value, seg(text, start=start), bounds=Bounds(max_sources=1000, max_occurrences=10**6))
    data = text.encode()
    at = start + len(before.encode())
    exact = [s for s in sources if s["match"] == "exact"]
    # the oracle is the text's own word edges (not the locator's edge check): a value that starts and ends with
    # a letter, at word edges in the text, is found exact at its offsets (the occurrences it makes of itself
    # overlapping the text around it aside)
    i, j = len(before), len(before) + len(value)
    plain = value[:1].isalpha() and value[-1:].isalpha()
    if plain and _word_edge(text, i, j) and text.count(value) == 1:
        assert {"start": at, "end": at + len(value.encode())} in [{"start": s["start"], "end": s["end"]}
                                                                 for s in exact]
    for s in exact:
        assert data[s["start"] - start:s["end"] - start] == value.encode()


@given(result=results, windows=st.lists(st.tuples(st.integers(0, 500), st.one_of(texts.map(str.encode), binary)),
                                        max_size=4))
def test_every_source_lies_within_what_was_read_and_decodes_to_its_value(result, windows):
    read = ReadWindows()
    for start, data in windows:
        read._keep(FILE, start, data)
    segments = read.segments()
    found = locate(result, segments)
    leaves = dict(grounding.result_fields(result))
    json.dumps(found, allow_nan=False)
    assert set(found) <= set(leaves)
    for path, sources in found.items():
        assert len(sources) <= grounding.DEFAULT_BOUNDS.max_sources
        for s in sources:
            [segment] = [g for g in segments if g.start <= s["start"] <= s["end"] <= g.end]
            span = segment.data[s["start"] - segment.start:s["end"] - segment.start]
            assert s["match"] in grounding.MATCHES and 0 <= s["score"] <= 1
            field = grounding._Field(leaves[path], grounding.DEFAULT_BOUNDS)
            if s["match"] == "exact":
                assert span == field.exact
            elif s["match"] in ("normalised", "ambiguous"):
                assert field.same(span.decode("utf-8"))


@given(value=values, repeat=st.integers(1, 50), sep=st.sampled_from(["", " ", "\n", ","]))
def test_repeated_and_overlapping_values_stay_within_the_source_bound(value, repeat, sep):
    bounds = Bounds(max_sources=3, max_occurrences=8)
    sources = one(value, seg(sep.join([value] * repeat)), bounds=bounds)
    assert sources is None or len(sources) <= 3  # None: the occurrences ran out before one was the value


@given(result=results, text=texts, budget=st.integers(0, 2000))
def test_the_budgets_are_never_exceeded(result, text, budget):
    spent = []
    original = grounding._Budget

    class Recording(original):
        def __setattr__(self, name, value):
            if value < 0:
                spent.append((name, value))
            super().__setattr__(name, value)

    grounding._Budget = Recording
    try:
        locate(result, [seg(text * 5)], bounds=Bounds(exact_budget_bytes=budget, normalised_budget_chars=budget,
                                                      fuzzy_budget_chars=budget))
    finally:
        grounding._Budget = original
    assert spent == []


@given(number=st.integers(min_value=-10**400, max_value=10**400) | st.floats(allow_nan=False), text=texts)
def test_huge_numbers_never_break_the_locator(number, text):
    if number in (float("inf"), float("-inf")):
        assert locate({"n": number}, [seg(text)]) == {}  # no JSON spells it: nothing to look for
        return
    found = locate({"n": number}, [seg(text + " ; " + abi.dumps(number) + " ; " + text)])  # "0 100" is one number
    assert found["n"] and found["n"][0]["match"] in ("exact", "normalised")


@given(text=texts)
def test_canonical_is_idempotent_on_any_unicode(text):
    assert canonical(canonical(text)) == canonical(text)
