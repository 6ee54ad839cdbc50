/*
 * classify.c -- label each line of a file, the label held to a shape while the model decodes.
 *
 * Input:  {"path": "reviews.txt",
 *          "labels": ["positive", "negative", "neutral"],  the label is one of these (the default), or
 *          "regex": "[1-5]",                               the label matches this regex, or
 *          "grammar": "start: ...",                        the label is a sentence of this Lark grammar
 *          "task": "What is the sentiment of this line?",  the question asked of each line
 *          "max_lines": 100, "max_tokens": 32}             all optional but path; at most 1000 lines
 * Result: {"path": ..., "lines": [{"line": 1, "label": "positive"}, ...],
 *          "counts": {"positive": 3, "negative": 1}}       counts in the order the labels first came
 *
 * One `infer` per non-blank line (blank lines are skipped but counted in the line
 * numbers), with tj_infer_choices, tj_infer_regex or tj_infer_grammar: whatever the
 * model is, every label it gives is one that was asked for. `max_tokens` bounds a
 * regex or grammar answer; labels get room for the longest. The file is read in
 * windows of at most 64 KiB kept in one static buffer, so memory stays flat; a line
 * longer than a window is labelled by its first window. The Python twin is classify.py
 * (the same commands, for a file under 64 KiB).
 */
#include "tensorjob.h"

#define WINDOW 65536
#define MAX_LINES 1000
#define MAX_LABELS 1024

static tj_str path, task, regex, grammar;
static tj_str labels[MAX_LABELS];
static size_t n_labels;
static uint32_t max_tokens, max_lines, handle;

static char window[WINDOW];                       /* the file's bytes from window_at */
static size_t window_len, pos;                    /* pos: the start of the next line in window */
static uint64_t window_at, file_len;
static int skipping;                              /* inside the rest of a line longer than a window */
static uint32_t line_number;

static tj_buf lines;                              /* the result's "lines", a JSON array being written */
static tj_str seen[MAX_LINES];                    /* each distinct label, and how often it came */
static uint32_t seen_count[MAX_LINES], n_seen, n_done;

static int is_blank(tj_str s) { return tj_trim(s).len == 0; }

static tj_cmd ask(tj_str line) {
    while (line.len && line.ptr[line.len - 1] == '\r') line.len--;
    tj_str prompt = tj_strf("%S\n\n%S", task, line);
    if (regex.ptr) return tj_infer_regex(prompt, max_tokens, regex);
    if (grammar.ptr) return tj_infer_grammar(prompt, max_tokens, grammar);
    return tj_infer_choices(prompt, max_tokens, labels, n_labels);
}

static tj_cmd finish(void) {
    tj_buf counts = tj_buf_new();
    tj_buf_putc(&counts, '{');
    for (uint32_t i = 0; i < n_seen; i++)
        tj_buf_printf(&counts, i ? ",%j:%u" : "%j:%u", tj_jsonf("%S", seen[i]), seen_count[i]);
    tj_buf_putc(&counts, '}');
    tj_buf_putc(&lines, ']');
    return tj_done(tj_jsonf("{\"path\":%S,\"lines\":%j,\"counts\":%j}", path,
                            (tj_json){lines.ptr, lines.len}, (tj_json){counts.ptr, counts.len}));
}

/* The next non-blank line's infer, a slice for more of the file, or the result. */
static tj_cmd next_line(void) {
    for (;;) {
        tj_str rest = {window + pos, window_len - pos};
        long nl = tj_index_of(rest, '\n');
        int at_end = window_at + window_len >= file_len;
        tj_str line;
        if (nl >= 0) {
            line = (tj_str){rest.ptr, (size_t)nl};
            pos += (size_t)nl + 1;
        } else if (at_end && rest.len) {
            line = rest;
            pos = window_len;
        } else if (at_end) {
            return finish();
        } else if (pos > 0) {
            return tj_slice(handle, window_at + pos, WINDOW); /* the unfinished line, from its start */
        } else {
            line = rest; /* longer than a window: labelled by this much, the rest skipped */
            pos = window_len;
            skipping = 1;
        }
        line_number++;
        if (!is_blank(line)) return ask(line);
    }
}

tj_cmd guest_init(tj_json input) {
    tj_str p = tj_get_str(input, "path");
    if (!p.ptr) return tj_fail("schema_validation_failed", TJ_STR("input needs a \"path\" string"));
    path = tj_keep(p);
    tj_str t = tj_get_str(input, "task");
    task = tj_keep(t.ptr ? t : TJ_STR("What is the sentiment of this line?"));
    regex = tj_get_str(input, "regex");
    grammar = tj_get_str(input, "grammar");
    if (regex.ptr) regex = tj_keep(regex);
    if (grammar.ptr) grammar = tj_keep(grammar);
    tj_json given = tj_get(input, "labels");
    if ((given.ptr != 0) + (regex.ptr != 0) + (grammar.ptr != 0) > 1)
        return tj_fail("schema_validation_failed", TJ_STR("give one of labels, regex and grammar"));
    if (given.ptr) {
        tj_iter it = tj_iter_of(given);
        tj_str key;
        tj_json label;
        while (n_labels < MAX_LABELS && tj_next(&it, &key, &label)) labels[n_labels++] = tj_keep(tj_as_str(label));
    } else if (!regex.ptr && !grammar.ptr) {
        labels[n_labels++] = TJ_STR("positive");
        labels[n_labels++] = TJ_STR("negative");
        labels[n_labels++] = TJ_STR("neutral");
    }
    max_tokens = (uint32_t)tj_get_u64(input, "max_tokens", 32);
    if (n_labels) { /* room for the longest label (a token is at least one byte) */
        size_t longest = 0;
        tj_buf b = tj_buf_keep();
        tj_buf_printf(&b, "%S Answer with one of: ", task);
        for (size_t i = 0; i < n_labels; i++) {
            if (labels[i].len > longest) longest = labels[i].len;
            tj_buf_printf(&b, i ? ", %S" : "%S", labels[i]);
        }
        tj_buf_putc(&b, '.');
        task = tj_buf_str(&b);
        max_tokens = (uint32_t)longest + 4;
    }
    max_lines = (uint32_t)tj_get_u64(input, "max_lines", 100);
    if (max_lines == 0 || max_lines > MAX_LINES) max_lines = MAX_LINES;
    lines = tj_buf_keep();
    tj_buf_putc(&lines, '[');
    return tj_open(path);
}

tj_cmd guest_step(tj_event ev) {
    switch (ev.type) {
    case TJ_EV_OPENED:
        if (!tj_eq(ev.kind, "text")) return tj_failf("unsupported", "%S is not text", path);
        handle = ev.handle;
        file_len = ev.len;
        return tj_slice(handle, 0, WINDOW);
    case TJ_EV_SLICED:
        window_at = ev.next_offset - ev.text.len;
        window_len = ev.text.len;
        for (size_t i = 0; i < window_len; i++) window[i] = ev.text.ptr[i];
        pos = 0;
        if (skipping) { /* drop the rest of the long line, up to its newline */
            long nl = tj_index_of(ev.text, '\n');
            if (nl < 0 && ev.next_offset < file_len) return tj_slice(handle, ev.next_offset, WINDOW);
            pos = nl < 0 ? window_len : (size_t)nl + 1;
            skipping = 0;
        }
        return next_line();
    case TJ_EV_INFER_DONE: {
        uint32_t i = 0;
        while (i < n_seen && !tj_str_eq(seen[i], ev.text)) i++;
        if (i == n_seen) seen[n_seen++] = tj_keep(ev.text);
        seen_count[i]++;
        if (lines.len > 1) tj_buf_putc(&lines, ',');
        tj_buf_printf(&lines, "{\"line\":%u,\"label\":%j}", line_number, tj_jsonf("%S", ev.text));
        if (++n_done == max_lines) return finish();
        return tj_progress(window_at + pos, file_len);
    }
    case TJ_EV_EMITTED:
        return next_line();
    default:
        return tj_failf("unsupported", "unexpected event %S", ev.name);
    }
}
