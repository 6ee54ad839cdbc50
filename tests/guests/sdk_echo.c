/*
 * sdk_echo.c -- exercises the C SDK for tests/sandbox/test_sdk_c.py.
 *
 * cf_init: the input's "cmd" picks what to answer: "echo" (the default)
 * returns the input's string "s" (unescaped, then re-escaped) with its bytes
 * in hex and other typed fields; the other values return one command built by
 * the matching SDK builder, so the test can check the exact wire bytes.
 * cf_step: emits a description of the parsed event (every field), plus the
 * string kept from the input (to check the persistent arena survives steps).
 */
#define TJ_ON_TOKEN
#include "tensorjob.h"

static tj_str kept;
static uint64_t tokens;

static tj_str hex(tj_str s) {
    static const char digits[] = "0123456789abcdef";
    tj_buf b = tj_buf_new();
    for (size_t i = 0; i < s.len; i++) {
        tj_buf_putc(&b, digits[(unsigned char)s.ptr[i] >> 4]);
        tj_buf_putc(&b, digits[(unsigned char)s.ptr[i] & 15]);
    }
    return tj_buf_str(&b);
}

int guest_on_token(tj_str token) {
    tokens++;
    return tj_eq(token, "stop") ? TJ_STOP : TJ_CONTINUE;
}

tj_cmd guest_init(tj_json input) {
    tj_str cmd = tj_get_str(input, "cmd");
    tj_str s = tj_get_str(input, "s");
    kept = tj_keep(s.ptr ? s : TJ_STR(""));
    if (!cmd.ptr || tj_eq(cmd, "echo")) {
        return tj_done(tj_jsonf(
            "{\"s\":%S,\"hex\":%S,\"len\":%zu,\"n\":%llu,\"i\":%lld,\"f\":%f,\"b\":%b,\"missing\":%j,"
            "\"missing_str\":%S,\"nested\":%j,\"kind_s\":%d,\"kind_nested\":%d}",
            s, hex(s), s.len, (unsigned long long)tj_get_u64(input, "n", 7), (long long)tj_get_i64(input, "i", -7),
            tj_get_f64(input, "f", 0.5), tj_get_bool(input, "b", 0), tj_get(input, "nope"),
            tj_get_str(input, "nope"), tj_get(input, "nested"), tj_kind(tj_get(input, "s")),
            tj_kind(tj_get(input, "nested"))));
    }
    if (tj_eq(cmd, "infer")) return tj_infer(s, 32);
    if (tj_eq(cmd, "infer_with")) return tj_infer_with(s, 16, tj_get(input, "options"));
    if (tj_eq(cmd, "infer_images")) {
        static const uint32_t images[] = {1, 4294967295u};
        return tj_infer_images(s, 0, images, 2);
    }
    if (tj_eq(cmd, "open")) return tj_open(s);
    if (tj_eq(cmd, "slice")) return tj_slice(7, 4294967296ull, 65536);
    if (tj_eq(cmd, "slice_bytes")) return tj_slice_bytes(0, 0, 18446744073709551615ull);
    if (tj_eq(cmd, "embed")) {
        tj_str texts[3] = {s, TJ_STR("b"), TJ_STR("")};
        return tj_embed(texts, 3);
    }
    if (tj_eq(cmd, "emit")) return tj_emit(tj_get(input, "payload"));
    if (tj_eq(cmd, "progress")) return tj_progress(3, 10);
    if (tj_eq(cmd, "done")) return tj_done(tj_get(input, "payload"));
    if (tj_eq(cmd, "done_null")) return tj_done((tj_json){0, 0});
    if (tj_eq(cmd, "fail")) return tj_fail("not_found", s);
    if (tj_eq(cmd, "failf")) return tj_failf("unsupported", "%s=%d %S", "x", -42, s);
    if (tj_eq(cmd, "bad_utf8")) return tj_done(tj_jsonf("%S", (tj_str){"a\xff" "b\xc3(\xed\xa0\x80" "c\xf0\x9f\x98", 12}));
    if (tj_eq(cmd, "format"))
        return tj_done(tj_jsonf("[%d,%u,%lld,%llu,%zu,\"%x\",%f,%f,%f,%f,%b,%b,\"%c\",%s,%j,\"%%\",%s]", -5, 4000000000u,
                                (long long)INT64_MIN, (unsigned long long)UINT64_MAX, (size_t)7, 255u, 1.5, -0.25,
                                1e20, 0.0, 1, 0, 'A', "q\"", tj_get(input, "payload"), (const char *)0));
    if (tj_eq(cmd, "strf")) return tj_done(tj_jsonf("%S", tj_strf("<%s|%S|%llu>", "raw \"c\"", s, 12345678901ull)));
    if (tj_eq(cmd, "iter")) {
        tj_buf keys = tj_buf_new(), kinds = tj_buf_new();
        tj_iter it = tj_iter_of(input);
        tj_str key;
        tj_json val;
        while (tj_next(&it, &key, &val)) {
            tj_buf_put(&keys, key);
            tj_buf_putc(&keys, ',');
            tj_buf_putc(&kinds, tj_kind(val));
        }
        uint64_t items = 0, sum = 0;
        it = tj_iter_of(tj_get(input, "list"));
        while (tj_next(&it, 0, &val)) { items++; sum += tj_as_u64(val, 1000); }
        return tj_done(tj_jsonf("{\"keys\":%S,\"kinds\":%S,\"items\":%llu,\"sum\":%llu}", tj_buf_str(&keys),
                                tj_buf_str(&kinds), items, sum));
    }
    if (tj_eq(cmd, "page_text")) return tj_page_text(3, 4294967295u);
    if (tj_eq(cmd, "page_text_opt")) return tj_page_text_opt(0, 7);
    if (tj_eq(cmd, "page_image")) return tj_page_image(1, 0);
    if (tj_eq(cmd, "document_text")) return tj_document_text(9);
    if (tj_eq(cmd, "resize")) return tj_image_resize(2, 512, 384);
    if (tj_eq(cmd, "crop")) return tj_image_crop(2, 1, 2, 3, 4294967295u);
    if (tj_eq(cmd, "fetch")) return tj_fetch(s);
    if (tj_eq(cmd, "none")) return (tj_cmd){0, 0};
    return tj_failf("unsupported", "unknown cmd %S", cmd);
}

tj_cmd guest_step(tj_event ev) {
    double sum = 0;
    uint64_t vectors = 0, dims = 0;
    tj_iter outer = tj_iter_of(ev.vectors);
    tj_json vec, x;
    while (tj_next(&outer, 0, &vec)) {
        vectors++;
        tj_iter inner = tj_iter_of(vec);
        while (tj_next(&inner, 0, &x)) { dims++; sum += tj_as_f64(x, 0); }
    }
    return tj_emit(tj_jsonf(
        "{\"type\":%d,\"name\":%S,\"text\":%S,\"text_hex\":%S,\"tokens_out\":%u,\"handle\":%u,\"len\":%llu,"
        "\"kind\":%S,\"format\":%S,\"next_offset\":%llu,\"bytes_hex\":%S,\"vectors\":%llu,\"dims\":%llu,"
        "\"sum\":%f,\"kept\":%S,\"tokens\":%llu,\"pages\":%u,\"has_text_layer\":%b,\"error\":%S,"
        "\"tool_calls\":%j}",
        (int)ev.type, ev.name, ev.text, hex(ev.text), ev.tokens_out, ev.handle, (unsigned long long)ev.len, ev.kind,
        ev.format, (unsigned long long)ev.next_offset, hex(tj_base64_decode(ev.bytes_base64)),
        (unsigned long long)vectors, (unsigned long long)dims, sum, kept, (unsigned long long)tokens, ev.pages,
        ev.has_text_layer, ev.error, ev.tool_calls));
}
