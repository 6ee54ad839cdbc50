"""Properties of ``image_op``: guest-chosen parameters can never enlarge, clamp or escape an image.

Three layers, each with Hypothesis: the wire (any JSON a guest sends as
``op`` parses to a valid operation with u32 fields, or is an ``AbiError`` --
nothing else), the geometry (``plan_image_op``, pure: a resize fits its
bounds, keeps the aspect ratio and never enlarges; a crop is taken exactly as
asked or refused, never clamped), and the real engine (random small images
and random operations through pdfium's sibling, Pillow, in the engine
process: the PNG that comes back has exactly the planned size).
"""

from __future__ import annotations

import io
import math

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from PIL import Image

from tensorjob_jupyter import abi
from tensorjob_jupyter.abi import codes
from tensorjob_jupyter.world.docworker import Refusal, plan_image_op
from tensorjob_jupyter.world.documents import DocumentError, JobDocuments
from tensorjob_jupyter.world.files import Handles, anonymous_file
from tensorjob_jupyter.limits import Limits

U32 = 2**32 - 1
sizes = st.integers(min_value=1, max_value=100_000)
u32s = st.one_of(st.integers(min_value=0, max_value=64), st.integers(min_value=0, max_value=U32))


def resize(mw, mh):
    return {"op": "resize", "max_width": mw, "max_height": mh}


def crop(x, y, w, h):
    return {"op": "crop", "x": x, "y": y, "width": w, "height": h}


# --- the wire ---------------------------------------------------------------------------------------

json_values = st.recursive(st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70)
                           | st.floats(allow_nan=False) | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                         max_size=4), max_leaves=8)
op_objects = st.fixed_dictionaries({"op": st.sampled_from(["resize", "crop", "rotate", 7, None])},
                                   optional={k: json_values | u32s for k in
                                             ("max_width", "max_height", "x", "y", "width", "height")})


@pytest.mark.slow
@given(op=op_objects | json_values)
@settings(max_examples=400)
def test_any_op_parses_to_a_valid_operation_or_an_abi_error(op):
    command = {"cmd": "image_op", "handle": 0, "op": op}
    try:
        parsed = abi.command_from_json(command)
    except abi.AbiError:
        return
    assert isinstance(parsed, abi.ImageOp)
    fields = parsed.op.to_json()
    assert fields["op"] in ("resize", "crop")
    for key, value in fields.items():
        if key != "op":
            assert type(value) is int and 0 <= value <= U32 and value == op[key]


def test_the_wire_form_is_cuttlefishs():
    cmd = abi.parse_command(b'{"cmd":"image_op","handle":3,"op":{"op":"crop","x":1,"y":2,"width":3,"height":4}}')
    assert cmd == abi.ImageOp(3, abi.Crop(1, 2, 3, 4))
    assert abi.dumps(cmd.to_json()) == '{"cmd":"image_op","handle":3,"op":{"op":"crop","x":1,"y":2,"width":3,"height":4}}'
    assert abi.dumps(abi.ImageOp(0, abi.Resize(512, 256)).to_json()) == (
        '{"cmd":"image_op","handle":0,"op":{"op":"resize","max_width":512,"max_height":256}}')


# --- the geometry -------------------------------------------------------------------------------------


@pytest.mark.slow
@given(width=sizes, height=sizes, mw=u32s, mh=u32s)
@settings(max_examples=2000)
def test_resize_fits_never_enlarges_and_keeps_the_aspect(width, height, mw, mh):
    try:
        kind, (w, h) = plan_image_op(resize(mw, mh), width, height)
    except Refusal as e:
        assert e.code == codes.UNSUPPORTED and (mw == 0 or mh == 0)
        return
    assert mw > 0 and mh > 0 and kind == "resize"
    assert 1 <= w <= min(mw, width) and 1 <= h <= min(mh, height)
    # It fills the bound that binds (within a pixel), so it is not needlessly small.
    scale = min(mw / width, mh / height, 1.0)
    assert w >= min(mw, width, math.floor(width * scale)) and h >= min(mh, height, math.floor(height * scale))
    if scale >= 1.0:
        assert (w, h) == (width, height)
    # The aspect ratio survives up to rounding to whole pixels.
    if w > 1 and h > 1:
        assert abs(w / h - width / height) <= (width / height) * (1 / min(w, h) + 1 / max(w, h)) * 1.01 + 1e-9


@pytest.mark.slow
@given(width=sizes, height=sizes, x=u32s, y=u32s, w=u32s, h=u32s)
@settings(max_examples=2000)
def test_crop_is_exact_or_refused_never_clamped(width, height, x, y, w, h):
    inside = w > 0 and h > 0 and x + w <= width and y + h <= height
    try:
        kind, region = plan_image_op(crop(x, y, w, h), width, height)
    except Refusal as e:
        assert not inside and e.code == codes.UNSUPPORTED
        return
    assert inside and kind == "crop" and region == (x, y, w, h)


# --- the real engine ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def docs():
    handles = Handles(max_handles=100_000)
    documents = JobDocuments(handles, Limits(max_handles=100_000))
    yield documents
    documents.close()
    handles.close()


def _image_handle(docs: JobDocuments, width: int, height: int, mode: str, fmt: str) -> int:
    image = Image.new(mode, (width, height), color=None)
    out = io.BytesIO()
    image.save(out, format=fmt)
    f = docs.handles.add(anonymous_file(out.getvalue()), f"{fmt} {width}x{height}")
    assert f.kind.kind == "image"
    return f.handle


ops = st.one_of(st.builds(resize, u32s, u32s), st.builds(crop, u32s, u32s, u32s, u32s),
                st.builds(resize, st.integers(1, 80), st.integers(1, 80)),
                st.builds(crop, st.integers(0, 40), st.integers(0, 40), st.integers(0, 40), st.integers(0, 40)))


@given(width=st.integers(1, 48), height=st.integers(1, 48), op=ops,
       mode_fmt=st.sampled_from([("RGB", "PNG"), ("RGBA", "PNG"), ("L", "PNG"), ("1", "PNG"), ("P", "PNG"),
                                 ("RGB", "JPEG"), ("P", "GIF"), ("RGB", "WEBP")]))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_the_engine_makes_exactly_the_planned_png_or_refuses(docs, width, height, op, mode_fmt):
    mode, fmt = mode_fmt
    assume(not (fmt == "JPEG" and mode != "RGB"))
    handle = _image_handle(docs, width, height, mode, fmt)
    try:
        expected = plan_image_op(op, width, height)
    except Refusal as e:
        with pytest.raises(DocumentError) as info:
            docs.image_op(handle, op)
        assert (info.value.code, info.value.message) == (e.code, e.message)
        return
    f = docs.image_op(handle, op)
    png = docs.handles.slice_bytes(f.handle, 0, f.len).data
    result = Image.open(io.BytesIO(png))
    assert result.format == "PNG"
    want = expected[1][2:] if expected[0] == "crop" else expected[1]
    assert result.size == tuple(want)
