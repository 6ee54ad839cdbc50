"""What one job read from fetched URLs (host/windows.py): each fetch is its own place (issue 53, item 8).

Two fetches of one URL can be answered with different bodies; their windows must never be spliced by offset into
text neither body held. And the URL the guest asked for is kept on the place, with the forms a server may read it
back in (``url_texts``), so that grounding can refuse an echo of what the guest itself put in the URL.
"""

import base64

from tensorjob_jupyter import abi
from tensorjob_jupyter.history.sources import source_excerpt, sources_text
from tensorjob_jupyter.host.grounding import locate, source_label
from tensorjob_jupyter.host.windows import Place, ReadWindows, url_texts

URL = "https://example.org/data/report"


class NoFiles:
    """The job's handles, for windows that only ever come from fetches."""

    def get(self, handle):
        raise AssertionError(f"handle {handle} is a fetch: its place needs no file")


def fetched(windows: ReadWindows, handle: int, url: str, body: str) -> None:
    windows.note(abi.Fetch(url), abi.Opened(handle, len(body.encode())), NoFiles())


def sliced(windows: ReadWindows, handle: int, body: str, offset: int) -> None:
    data = body.encode()[offset:]
    windows.note(abi.Slice(handle, offset, len(data)), abi.Sliced(data.decode(), len(body.encode())), NoFiles())


def test_two_fetches_of_one_url_are_two_places_and_never_spliced():
    first, second = "ACME Co", "Total: rp 99"  # byte 7 of the second body is where the first one ends
    windows = ReadWindows()
    fetched(windows, 0, URL, first)
    sliced(windows, 0, first, 0)
    fetched(windows, 1, URL, second)
    sliced(windows, 1, second, 7)
    segments = windows.segments()
    assert [(s.place, s.start, s.data) for s in segments] == [
        (Place(url=URL, fetch=0), 0, b"ACME Co"), (Place(url=URL, fetch=1), 7, b"rp 99")]
    found = locate({"name": "ACME Corp", "a": "ACME Co", "b": "rp 99"}, segments)
    assert found["name"] == []  # served in neither body
    assert [(s["url"], s["start"], s["end"]) for s in found["a"]] == [(URL, 0, 7)]
    assert [(s["url"], s["start"], s["end"]) for s in found["b"]] == [(URL, 7, 12)]


def test_windows_of_one_fetch_still_merge():
    body = "the total is 1,234 units"
    windows = ReadWindows()
    fetched(windows, 3, URL, body)
    windows.note(abi.Slice(3, 0, 16), abi.Sliced(body[:16], 16), NoFiles())
    windows.note(abi.SliceBytes(3, 16, 8), abi.SlicedBytes(base64.b64encode(body[16:].encode()).decode(), 24),
                 NoFiles())
    [segment] = windows.segments()
    assert (segment.place, segment.data) == (Place(url=URL, fetch=3), body.encode())
    [source] = locate({"n": 1234}, [segment])["n"]
    assert (source["start"], source["end"]) == (13, 18)


def test_pages_of_two_fetches_of_one_url_are_apart():
    windows = ReadWindows()
    fetched(windows, 0, URL, "%PDF")
    fetched(windows, 1, URL, "%PDF")
    windows.note(abi.PageText(0, 2), abi.PageTexted("ACME Co"), NoFiles())
    windows.note(abi.PageText(1, 2), abi.PageTexted("rp"), NoFiles())
    assert [s.place for s in windows.segments()] == [Place(url=URL, page=2, fetch=0), Place(url=URL, page=2, fetch=1)]


def test_a_fetched_source_names_the_url_a_person_reads():
    windows = ReadWindows()
    fetched(windows, 5, URL, "Invoice: ACME Corp")
    sliced(windows, 5, "Invoice: ACME Corp", 0)
    found = locate({"name": "ACME Corp"}, windows.segments())
    [source] = found["name"]
    assert source["url"] == URL and source["file"] is None
    assert source_label(source) == f"{URL}:9-18"
    assert source_excerpt(source) is None  # a fetched body is not kept: offsets only
    text = sources_text({"status": "completed", "result": {"name": "ACME Corp"}, "sources": found})
    assert f"name = \"ACME Corp\": {URL}:9-18 exact 1" in text


def test_the_place_keeps_the_url_the_guest_asked_for_and_its_decoded_forms():
    url = "https://example.org/search?q=ACME%20Corp&x=Big+Co&y=Zo%25C3%25AB"
    windows = ReadWindows()
    fetched(windows, 0, url, "results for ACME Corp")
    sliced(windows, 0, "results for ACME Corp", 0)
    [segment] = windows.segments()
    assert segment.place.url == url and segment.place.fetch == 0
    forms = segment.place.url_texts
    assert forms[0] == url
    assert any("q=ACME Corp" in f for f in forms)  # %20
    assert any("x=Big Co" in f for f in forms)  # + in a form's query
    assert any("y=Zoë" in f for f in forms)  # encoded twice
    assert Place(file="/docs/a.txt").url_texts == ()


def test_url_texts_is_bounded_and_distinct():
    url = "https://example.org/" + "%25" * 10 + "41"
    forms = url_texts(url)
    assert len(forms) == len(set(forms)) <= 1 + 2 * 4
    assert url_texts("https://example.org/plain") == ("https://example.org/plain",)
