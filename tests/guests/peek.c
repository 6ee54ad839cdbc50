/* peek.c -- a model-free guest for the run-folder and field-name tests: opens input.path and reads its first
 * window. With input.answer it returns that (values planted beside one copied from the window); else it
 * returns the "expected" member of the window's line number input.line -- a guest that grades itself from a
 * map's expected.jsonl where a read grant lets it. */
#include "tensorjob.h"

static tj_json answer;
static uint64_t line;

tj_cmd guest_init(tj_json input) {
    answer = tj_keep_json(tj_get(input, "answer"));
    line = tj_get_u64(input, "line", 0);
    return tj_open(tj_keep(tj_get_str(input, "path")));
}

tj_cmd guest_step(tj_event ev) {
    if (ev.type == TJ_EV_OPENED) return tj_slice(ev.handle, 0, 65536);
    if (ev.type == TJ_EV_SLICED) {
        if (answer.ptr) return tj_done(answer);
        size_t start = 0;
        uint64_t n = 0;
        for (size_t i = 0; i < ev.text.len; i++) {
            if (ev.text.ptr[i] != '\n') continue;
            if (n++ == line) return tj_done(tj_get(tj_parse((tj_str){ev.text.ptr + start, i - start}), "expected"));
            start = i + 1;
        }
        return tj_fail("not_found", TJ_STR("no such line"));
    }
    return tj_failf("unsupported", "unexpected event %S", ev.name);
}
