/*
 * summarise.c -- the summariser: summarise a document one window at a time.
 *
 * Input:  {"path": "report.txt", "window": 4096, "max_tokens": 128}
 *         (window, in bytes, and max_tokens are optional)
 * Result: {"path": ..., "windows": n, "summary": "<one summary per window, joined by newlines>"}
 *
 * For each window: `slice` it, `infer` once with a prompt that quotes the
 * window, then `emit` progress {"done": i, "total": n}. Only the summaries so
 * far are kept between steps (in the persistent arena); each window lives in
 * scratch memory for the one step that builds its prompt. `total` starts as
 * ceil(len / window) and is corrected as windows are cut back to UTF-8
 * boundaries, so the last progress event always has done == total.
 */
#include "tensorjob.h"

static tj_str path;
static uint32_t handle, max_tokens;
static uint64_t file_len, offset, window, windows, total;
static tj_buf summary; /* persistent: the joined infer texts */

static tj_cmd finish(void) {
    return tj_done(tj_jsonf("{\"path\":%S,\"windows\":%llu,\"summary\":%S}", path, windows, tj_buf_str(&summary)));
}

tj_cmd guest_init(tj_json input) {
    tj_str p = tj_get_str(input, "path");
    if (!p.ptr) return tj_fail("schema_validation_failed", TJ_STR("input needs a \"path\" string"));
    path = tj_keep(p);
    window = tj_get_u64(input, "window", 4096);
    if (window == 0) window = 4096;
    max_tokens = (uint32_t)tj_get_u64(input, "max_tokens", 128);
    summary = tj_buf_keep();
    return tj_open(path);
}

tj_cmd guest_step(tj_event ev) {
    switch (ev.type) {
    case TJ_EV_OPENED:
        if (!tj_eq(ev.kind, "text")) return tj_failf("unsupported", "%S is not text", path);
        handle = ev.handle;
        file_len = ev.len;
        if (file_len == 0) return finish();
        total = (file_len + window - 1) / window;
        return tj_slice(handle, 0, window);

    case TJ_EV_SLICED: {
        if (ev.next_offset <= offset && ev.text.len == 0) {
            if (offset >= file_len || windows) return finish();
            return tj_failf("wasm_trap", "no progress at offset %llu", offset);
        }
        offset = ev.next_offset;
        windows++;
        tj_str prompt = tj_strf(
            "Summarise part %llu of %llu of the document %S in one or two sentences.\n"
            "<document>\n%S\n</document>\nSummary:",
            windows, total > windows ? total : windows, path, ev.text);
        return tj_infer(prompt, max_tokens);
    }

    case TJ_EV_INFER_DONE:
        if (windows > 1) tj_buf_putc(&summary, '\n');
        tj_buf_put(&summary, tj_trim(ev.text));
        if (offset >= file_len) {
            total = windows;
        } else if (total < windows + 1) {
            total = windows + (file_len - offset + window - 1) / window;
        }
        return tj_progress(windows, total);

    case TJ_EV_EMITTED:
        if (offset >= file_len) return finish();
        return tj_slice(handle, offset, window);

    default:
        return tj_failf("unsupported", "unexpected event %S", ev.name);
    }
}
