/* quote.c -- a model-free guest for the sources tests: opens input.path, reads its first window, and returns
 * {"quote": <the window's first line>, "claim": input.claim} -- one field copied from what it read, one it
 * was only told. */
#include "tensorjob.h"

static tj_json claim;

tj_cmd guest_init(tj_json input) {
    claim = tj_keep_json(tj_get(input, "claim"));
    return tj_open(tj_keep(tj_get_str(input, "path")));
}

tj_cmd guest_step(tj_event ev) {
    if (ev.type == TJ_EV_OPENED) return tj_slice(ev.handle, 0, 4096);
    if (ev.type == TJ_EV_SLICED) {
        size_t n = 0;
        while (n < ev.text.len && ev.text.ptr[n] != '\n') n++;
        tj_str line = {ev.text.ptr, n};
        return tj_done(tj_jsonf("{\"quote\":%S,\"claim\":%j}", line, claim));
    }
    return tj_failf("unsupported", "unexpected event %S", ev.name);
}
