"""Grants and file windows, attacked the way a hostile guest would."""

import os

import pytest

from tensorjob_jupyter.abi import codes
from tensorjob_jupyter.world.grants import AccessError, Grants
from tensorjob_jupyter.world.files import Handles, sniff


@pytest.fixture
def tree(tmp_path):
    data = tmp_path / "data"
    (data / "inner").mkdir(parents=True)
    (data / "a.txt").write_text("hello")
    (data / "inner" / "deep.txt").write_text("deep")
    secret = tmp_path / "data-secret"
    secret.mkdir()
    (secret / "s.txt").write_text("secret")
    (tmp_path / "outside.txt").write_text("outside")
    return tmp_path


def denied(grants, path):
    with pytest.raises(AccessError) as info:
        grants.resolve(path)
    return info.value


def test_allows_a_read_under_a_granted_root_and_nested_deeper(tree):
    g = Grants.for_paths([tree / "data"])
    assert g.resolve(str(tree / "data" / "a.txt")).read_text() == "hello"
    assert g.resolve(str(tree / "data" / "inner" / "deep.txt")).read_text() == "deep"


def test_a_single_file_can_be_a_root(tree):
    g = Grants.for_paths([tree / "data" / "a.txt"])
    assert g.resolve(str(tree / "data" / "a.txt"))
    assert denied(g, str(tree / "data" / "inner" / "deep.txt")).code == codes.CAPABILITY_DENIED


def test_denies_traversal_out_of_a_granted_root(tree):
    g = Grants.for_paths([tree / "data"])
    assert denied(g, str(tree / "data" / "inner" / ".." / ".." / "outside.txt")).code == codes.CAPABILITY_DENIED


def test_denies_a_symlink_pointing_out_of_a_granted_root(tree):
    os.symlink(tree / "outside.txt", tree / "data" / "link.txt")
    g = Grants.for_paths([tree / "data"])
    assert denied(g, str(tree / "data" / "link.txt")).code == codes.CAPABILITY_DENIED


def test_a_symlink_staying_inside_the_root_is_fine(tree):
    os.symlink(tree / "data" / "a.txt", tree / "data" / "alias.txt")
    assert Grants.for_paths([tree / "data"]).resolve(str(tree / "data" / "alias.txt")).name == "a.txt"


def test_a_sibling_directory_sharing_a_name_prefix_is_denied(tree):
    g = Grants.for_paths([tree / "data"])
    assert denied(g, str(tree / "data-secret" / "s.txt")).code == codes.CAPABILITY_DENIED


def test_denies_an_absolute_path_outside_and_a_nul_byte(tree):
    g = Grants.for_paths([tree / "data"])
    assert denied(g, "/etc/passwd").code == codes.CAPABILITY_DENIED
    assert denied(g, str(tree / "data" / "a.txt") + "\0.png").code == codes.CAPABILITY_DENIED
    assert denied(g, "").code == codes.CAPABILITY_DENIED


def test_denies_everything_when_nothing_is_granted_or_the_root_does_not_exist(tree):
    assert denied(Grants.for_paths([]), str(tree / "data" / "a.txt")).code == codes.CAPABILITY_DENIED
    g = Grants.for_paths([tree / "nope"])
    assert g.roots == ()
    assert denied(g, str(tree / "nope" / "x")).code == codes.CAPABILITY_DENIED


def test_a_missing_file_inside_a_grant_is_not_found_but_outside_is_denied(tree):
    g = Grants.for_paths([tree / "data"])
    assert denied(g, str(tree / "data" / "missing.txt")).code == codes.NOT_FOUND
    assert denied(g, str(tree / "data" / "nodir" / "missing.txt")).code == codes.NOT_FOUND
    # No existence oracle outside the grant: present and absent look the same.
    assert denied(g, str(tree / "outside.txt")).code == codes.CAPABILITY_DENIED
    assert denied(g, str(tree / "absent.txt")).code == codes.CAPABILITY_DENIED
    assert denied(g, str(tree / "data" / ".." / "absent.txt")).code == codes.CAPABILITY_DENIED


def test_a_dangling_symlink_is_denied_not_reported_missing(tree):
    os.symlink(tree / "gone.txt", tree / "data" / "dangling.txt")
    assert denied(Grants.for_paths([tree / "data"]), str(tree / "data" / "dangling.txt")).code == codes.CAPABILITY_DENIED


def test_any_one_of_several_roots_suffices(tree):
    g = Grants.for_paths([tree / "data-secret", tree / "data"])
    assert g.resolve(str(tree / "data" / "a.txt"))
    assert g.resolve(str(tree / "data-secret" / "s.txt"))


def test_a_relative_path_is_resolved_against_the_job_directory(tree):
    g = Grants.for_paths(["data"], cwd=tree)
    assert g.resolve("data/a.txt") == (tree / "data" / "a.txt").resolve()


def test_open_refuses_directories_and_fifos(tree):
    os.mkfifo(tree / "data" / "pipe")
    g = Grants.for_paths([tree / "data"])
    with pytest.raises(AccessError, match="directory"):
        g.open_checked(str(tree / "data" / "inner"))
    with pytest.raises(AccessError, match="not a regular file"):
        g.open_checked(str(tree / "data" / "pipe"))  # must not block waiting for a writer


# --- handles and windows -----------------------------------------------------------------


def open_file(tmp_path, content: bytes, handles=None, name="f.bin"):
    p = tmp_path / name
    p.write_bytes(content)
    handles = handles if handles is not None else Handles()
    fd, canonical = Grants.for_paths([tmp_path]).open_checked(str(p))
    return handles, handles.add(fd, canonical)


def test_open_reports_length_without_reading_and_handles_count_from_zero(tmp_path):
    handles, f = open_file(tmp_path, b"x" * 10_000)
    assert (f.handle, f.len, f.bytes_read) == (0, 10_000, 0)
    _, g = open_file(tmp_path, b"y", handles, "g.txt")
    assert g.handle == 1


def test_slices_are_windows_clamped_to_the_file(tmp_path):
    handles, f = open_file(tmp_path, b"hello world")
    w = handles.slice(f.handle, 6, 100)
    assert (w.text, w.next_offset) == ("world", 11)
    end = handles.slice(f.handle, 11, 5)
    assert (end.text, end.next_offset) == ("", 11)
    with pytest.raises(AccessError, match="past end of file"):
        handles.slice(f.handle, 12, 1)


def test_slice_truncates_to_a_character_boundary(tmp_path):
    handles, f = open_file(tmp_path, "aéb".encode())
    w = handles.slice(f.handle, 0, 2)
    assert (w.text, w.next_offset) == ("a", 1)


def test_walking_a_multibyte_file_in_tiny_windows_reconstructs_it(tmp_path):
    text = "naïve café — 日本語 🎉 ok"
    handles, f = open_file(tmp_path, text.encode())
    out, offset = "", 0
    while offset < f.len:
        w = handles.slice(f.handle, offset, 4)
        assert w.next_offset > offset
        out, offset = out + w.text, w.next_offset
    assert out == text


def test_a_window_too_small_for_one_character_is_an_error_not_an_empty_read(tmp_path):
    handles, f = open_file(tmp_path, "🎉!".encode())
    with pytest.raises(AccessError, match="too small to hold one character"):
        handles.slice(f.handle, 0, 2)


def test_invalid_utf8_says_to_use_slice_bytes(tmp_path):
    handles, f = open_file(tmp_path, b"\xff\xfe\x00binary")
    with pytest.raises(AccessError, match="slice_bytes"):
        handles.slice(f.handle, 0, 8)
    assert handles.slice_bytes(f.handle, 0, 3).data == b"\xff\xfe\x00"


def test_the_window_cap_returns_fewer_bytes_never_more(tmp_path):
    handles, f = open_file(tmp_path, b"a" * 100, Handles(max_window_bytes=16))
    w = handles.slice(f.handle, 0, 1000)
    assert (len(w.data), w.next_offset) == (16, 16)
    assert len(handles.slice_bytes(f.handle, 0, 1000).data) == 16


def test_an_unknown_handle_is_rejected(tmp_path):
    handles, _ = open_file(tmp_path, b"x")
    with pytest.raises(AccessError, match="no such handle: 7") as info:
        handles.slice(7, 0, 1)
    assert info.value.code == codes.CAPABILITY_DENIED


def test_handles_are_capped(tmp_path):
    handles, _ = open_file(tmp_path, b"x", Handles(max_handles=1))
    with pytest.raises(AccessError) as info:
        open_file(tmp_path, b"y", handles, "g")
    assert info.value.code == codes.LIMIT_EXCEEDED


def test_offsets_past_4_gib_work_on_a_sparse_file(tmp_path):
    p = tmp_path / "sparse.bin"
    with open(p, "wb") as f:
        f.seek(5 * 2**30)
        f.write(b"tail text")
    handles = Handles()
    fd, canonical = Grants.for_paths([tmp_path]).open_checked(str(p))
    f = handles.add(fd, canonical)
    w = handles.slice(f.handle, 5 * 2**30, 100)
    assert (w.text, w.next_offset) == ("tail text", 5 * 2**30 + 9)


def test_content_sniffing_ignores_names():
    assert sniff(b"\x89PNG\r\n\x1a\n...", 100).to_json() == {"kind": "image", "format": "png"}
    assert sniff(b"\xff\xd8\xff\xe0", 10).format == "jpeg"
    assert sniff(b"GIF89a", 10).format == "gif"
    assert sniff(b"RIFF\0\0\0\0WEBPVP8 ", 20).format == "webp"
    assert sniff(b"", 0).kind == "text"
    assert sniff("plain ü".encode(), 8).kind == "text"
    assert sniff("ab🎉".encode()[:-1], 100).kind == "text"  # a character cut by the sniff window
    assert sniff(b"\x00\x01\x02\xff", 4).kind == "binary"
    # A PDF is a document; the reactor asks the document engine for its pages (tests/world/test_documents.py).
    assert sniff(b"%PDF-1.7", 8).to_json() == {"kind": "document", "pages": 0, "has_text_layer": False}
