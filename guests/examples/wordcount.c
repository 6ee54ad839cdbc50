/*
 * wordcount.c -- count the words and bytes of a file of any size.
 *
 * Input:  {"path": "notes.txt", "window": 65536}   (window optional)
 * Result: {"path": ..., "words": N, "bytes": M}
 *
 * The file never enters guest memory whole: the guest walks it with `slice`
 * windows, resuming each time from the host's next_offset (the host cuts
 * windows back to a UTF-8 boundary), and carries only two counters and an
 * "inside a word" flag from one window to the next. So the guest's memory is
 * the same for a 1 MiB file and a 64 GiB one. Words are runs of
 * non-whitespace, as Python's str.split() sees them for ASCII whitespace.
 */
#include "tensorjob.h"

static tj_str path;          /* kept across steps (persistent arena) */
static uint32_t handle;
static uint64_t file_len, offset, window, words, bytes, windows;
static int in_word;

static int is_space(unsigned char c) {
    return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f);
}

tj_cmd guest_init(tj_json input) {
    tj_str p = tj_get_str(input, "path");
    if (!p.ptr) return tj_fail("schema_validation_failed", TJ_STR("input needs a \"path\" string"));
    path = tj_keep(p);
    window = tj_get_u64(input, "window", 65536);
    if (window == 0) window = 65536;
    return tj_open(path);
}

static tj_cmd finish(void) {
    return tj_done(tj_jsonf("{\"path\":%S,\"words\":%llu,\"bytes\":%llu}", path, words, bytes));
}

tj_cmd guest_step(tj_event ev) {
    switch (ev.type) {
    case TJ_EV_OPENED:
        if (!tj_eq(ev.kind, "text")) return tj_failf("unsupported", "%S is not text", path);
        handle = ev.handle;
        file_len = ev.len;
        if (file_len == 0) return finish();
        return tj_slice(handle, 0, window);
    case TJ_EV_SLICED:
        for (size_t i = 0; i < ev.text.len; i++) {
            int space = is_space((unsigned char)ev.text.ptr[i]);
            if (!space && !in_word) words++;
            in_word = !space;
        }
        bytes += ev.text.len;
        windows++;
        if (ev.next_offset <= offset && ev.text.len == 0 && ev.next_offset < file_len)
            return tj_failf("wasm_trap", "no progress at offset %llu", offset);
        offset = ev.next_offset;
        if (offset >= file_len) return finish();
        /* Progress after the first window, then every 16th: a small event stream. */
        if (windows % 16 == 1) return tj_progress(offset, file_len);
        return tj_slice(handle, offset, window);
    case TJ_EV_EMITTED:
        return tj_slice(handle, offset, window);
    default:
        return tj_failf("unsupported", "unexpected event %S", ev.name);
    }
}
