/*
 * infer_echo.c -- one infer with options, for tests/host/test_structured.py.
 *
 * Input:  {"prompt": ..., "max_tokens": n, "options": {...}} (options: format, tools, sampling)
 * Result: {"event": <the infer_done event as received>, "streamed": <every token cf_on_token saw>,
 *          "parsed": <the text as JSON, when it is JSON>, "call": <the first tool call's arguments as JSON>}
 */
#define TJ_ON_TOKEN
#include "tensorjob.h"

static tj_buf streamed;

int guest_on_token(tj_str token) {
    tj_buf_put(&streamed, token);
    return TJ_CONTINUE;
}

tj_cmd guest_init(tj_json input) {
    streamed = tj_buf_keep();
    return tj_infer_with(tj_get_str(input, "prompt"), (uint32_t)tj_get_u64(input, "max_tokens", 32),
                         tj_get(input, "options"));
}

tj_cmd guest_step(tj_event ev) {
    if (ev.type != TJ_EV_INFER_DONE) return tj_failf("unsupported", "unexpected event %S", ev.name);
    tj_json parsed = tj_parse(ev.text);
    char k = tj_kind(parsed);
    if (k != '{' && k != '[') parsed = (tj_json){0, 0};
    tj_json call = {0, 0};
    if (ev.tool_calls.ptr) {
        tj_iter it = tj_iter_of(ev.tool_calls);
        tj_str key;
        tj_json first;
        if (tj_next(&it, &key, &first)) call = tj_parse(tj_get_str(first, "arguments"));
    }
    return tj_done(tj_jsonf("{\"event\":%j,\"streamed\":%S,\"parsed\":%j,\"call\":%j}", ev.json,
                            tj_buf_str(&streamed), parsed, call));
}
