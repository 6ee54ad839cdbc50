/*
 * pdf_summary.c -- summarise a PDF page by page.
 *
 * Input:  {"path": "report.pdf", "max_tokens": 32, "max_chars": 1500}
 *         (max_tokens per page summary and max_chars, the most bytes of a
 *         page's text put in a prompt, are optional)
 *   or    {"url": "https://example.org/report.pdf", ...} to fetch it instead
 *         (the job must grant the URL: --fetch https://example.org/)
 * Result: {"source": ..., "pages": n, "summarised": k, "skipped": m,
 *          "summaries": [{"page": 0, "summary": "..."},
 *                        {"page": 2, "skipped": "page 2 has no text layer ..."}, ...]}
 *
 * For each page (counted from 0): `page_text_opt` reads its text -- a page
 * without text (a scan) comes back as an error, which is recorded and
 * skipped, not a failure of the job -- then one short `infer` summarises it,
 * then `emit` reports progress {"done": i, "total": n}. A file that is not a
 * PDF fails the job with `unsupported`. Only the summaries so far are kept
 * between steps (in the persistent arena); each page's text lives in
 * scratch memory for the one step that builds its prompt.
 */
#include "tensorjob.h"

static tj_str source;
static uint32_t handle, pages, page, max_tokens, summarised, skipped;
static uint64_t max_chars;
static tj_buf summaries; /* persistent: the JSON array's items, comma-separated */

/* The longest prefix of `s` that is at most `n` bytes and ends on a UTF-8 boundary. */
static tj_str utf8_prefix(tj_str s, uint64_t n) {
    if (s.len <= n) return s;
    size_t end = (size_t)n;
    while (end > 0 && ((unsigned char)s.ptr[end] & 0xC0) == 0x80) end--;
    return (tj_str){s.ptr, end};
}

static void record(tj_json item) {
    if (summaries.len) tj_buf_putc(&summaries, ',');
    tj_buf_write(&summaries, item.ptr, item.len);
}

static tj_cmd finish(void) {
    tj_str items = tj_buf_str(&summaries);
    return tj_done(tj_jsonf("{\"source\":%S,\"pages\":%u,\"summarised\":%u,\"skipped\":%u,\"summaries\":[%j]}",
                            source, pages, summarised, skipped, (tj_json){items.ptr, items.len}));
}

tj_cmd guest_init(tj_json input) {
    tj_str path = tj_get_str(input, "path"), url = tj_get_str(input, "url");
    if (!path.ptr && !url.ptr)
        return tj_fail("schema_validation_failed", TJ_STR("input needs a \"path\" or a \"url\" string"));
    max_tokens = (uint32_t)tj_get_u64(input, "max_tokens", 32);
    max_chars = tj_get_u64(input, "max_chars", 1500);
    summaries = tj_buf_keep();
    source = tj_keep(path.ptr ? path : url);
    return path.ptr ? tj_open(source) : tj_fetch(source);
}

tj_cmd guest_step(tj_event ev) {
    switch (ev.type) {
    case TJ_EV_OPENED:
        if (!tj_eq(ev.kind, "document"))
            return tj_failf("unsupported", "%S is not a PDF the host can read (it opened as %S)", source, ev.kind);
        handle = ev.handle;
        pages = ev.pages;
        if (pages == 0) return finish();
        return tj_page_text_opt(handle, 0);

    case TJ_EV_PAGE_TEXT_ATTEMPTED: {
        tj_str text = tj_trim(ev.text);
        if (ev.error.ptr || text.len == 0) {
            skipped++;
            record(tj_jsonf("{\"page\":%u,\"skipped\":%S}", page, ev.error.ptr ? ev.error : TJ_STR("no text")));
            return tj_progress(page + 1, pages);
        }
        tj_str prompt = tj_strf("Summarise page %u of %u of a document in one short sentence.\n"
                                "<page>\n%S\n</page>\nSummary:",
                                page + 1, pages, utf8_prefix(text, max_chars));
        return tj_infer(prompt, max_tokens);
    }

    case TJ_EV_INFER_DONE:
        summarised++;
        record(tj_jsonf("{\"page\":%u,\"summary\":%S}", page, tj_trim(ev.text)));
        return tj_progress(page + 1, pages);

    case TJ_EV_EMITTED:
        if (++page >= pages) return finish();
        return tj_page_text_opt(handle, page);

    default:
        return tj_failf("unsupported", "unexpected event %S", ev.name);
    }
}
