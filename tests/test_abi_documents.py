"""The wire forms of the document, image and fetch commands and events, pinned byte for byte."""

import pytest

from tensorjob_jupyter import abi
from tensorjob_jupyter.abi import AbiError

COMMANDS = [
    (b'{"cmd":"page_text","handle":0,"page":2}', abi.PageText(0, 2)),
    (b'{"cmd":"page_text_opt","handle":1,"page":0}', abi.PageTextOpt(1, 0)),
    (b'{"cmd":"page_image","handle":4294967295,"page":4294967295}', abi.PageImage(2**32 - 1, 2**32 - 1)),
    (b'{"cmd":"document_text","handle":3}', abi.DocumentText(3)),
    (b'{"cmd":"image_op","handle":1,"op":{"op":"resize","max_width":512,"max_height":384}}',
     abi.ImageOp(1, abi.Resize(512, 384))),
    (b'{"cmd":"image_op","handle":1,"op":{"op":"crop","x":0,"y":10,"width":20,"height":30}}',
     abi.ImageOp(1, abi.Crop(0, 10, 20, 30))),
    (b'{"cmd":"fetch","url":"https://example.org/a.pdf"}', abi.Fetch("https://example.org/a.pdf")),
]


@pytest.mark.parametrize("raw,command", COMMANDS, ids=[c.cmd for _, c in COMMANDS])
def test_commands_parse_and_serialise_exactly(raw, command):
    assert abi.parse_command(raw) == command
    assert abi.dumps(command.to_json()).encode() == raw


def test_unknown_keys_are_ignored_and_key_order_is_free():
    assert abi.parse_command(b'{"page":1,"extra":[1],"cmd":"page_text","handle":2}') == abi.PageText(2, 1)
    assert abi.parse_command(b'{"cmd":"image_op","op":{"height":1,"op":"crop","x":0,"y":0,"width":1,"z":9},'
                             b'"handle":0}') == abi.ImageOp(0, abi.Crop(0, 0, 1, 1))


@pytest.mark.parametrize("raw,fragment", [
    (b'{"cmd":"page_text","handle":0}', "`page_text` is missing field `page`"),
    (b'{"cmd":"page_text","handle":0,"page":-1}', "`page_text.page` must not be negative"),
    (b'{"cmd":"page_image","handle":0,"page":4294967296}', "out of range"),
    (b'{"cmd":"page_text_opt","handle":0.5,"page":0}', "must be an unsigned integer"),
    (b'{"cmd":"document_text"}', "`document_text` is missing field `handle`"),
    (b'{"cmd":"image_op","handle":0}', "`image_op` is missing field `op`"),
    (b'{"cmd":"image_op","handle":0,"op":"resize"}', "`image_op.op` must be a JSON object"),
    (b'{"cmd":"image_op","handle":0,"op":{"max_width":1,"max_height":1}}', "has no `op` tag"),
    (b'{"cmd":"image_op","handle":0,"op":{"op":"blur"}}', "unknown image operation `blur`"),
    (b'{"cmd":"image_op","handle":0,"op":{"op":"resize","max_width":1}}', "missing field `max_height`"),
    (b'{"cmd":"image_op","handle":0,"op":{"op":"crop","x":-1,"y":0,"width":1,"height":1}}', "must not be negative"),
    (b'{"cmd":"image_op","handle":0,"op":{"op":5}}', "must be a string"),
    (b'{"cmd":"fetch"}', "`fetch` is missing field `url`"),
    (b'{"cmd":"fetch","url":["x"]}', "`fetch.url` must be a string"),
])
def test_malformed_document_commands_name_the_problem(raw, fragment):
    with pytest.raises(AbiError) as info:
        abi.parse_command(raw)
    assert fragment in str(info.value)


EVENTS = [
    (abi.PageTexted("a\fb \u00e9"), '{"event":"page_texted","text":"a\\fb é"}'),
    (abi.PageTextAttempted("text", None), '{"event":"page_text_attempted","text":"text","error":null}'),
    (abi.PageTextAttempted(None, "page 2 has no text layer"),
     '{"event":"page_text_attempted","text":null,"error":"page 2 has no text layer"}'),
    (abi.PageImaged(5, 123456), '{"event":"page_imaged","handle":5,"len":123456}'),
    (abi.Opened(0, 3674, abi.MediaKind("document", pages=4, has_text_layer=True)),
     '{"event":"opened","handle":0,"len":3674,"kind":{"kind":"document","pages":4,"has_text_layer":true}}'),
]


@pytest.mark.parametrize("event,wire", EVENTS, ids=[type(e).__name__ for e, _ in EVENTS])
def test_events_encode_exactly_and_round_trip(event, wire):
    assert abi.encode_event(event) == wire.encode()
    assert abi.event_from_json(abi.loads_strict(wire.encode())) == event
