/*
 * stop_early.c -- end a generation early from cf_on_token.
 *
 * Input:  {"prompt": "...", "max_tokens": 64, "stop_after": 0, "stop_at": "."}
 *         (all optional). Generation stops at the first token that contains
 *         `stop_at`, or after `stop_after` tokens when that is not 0.
 * Result: {"text": <the infer text>, "tokens_out": n, "tokens_seen": m,
 *          "stopped": true|false, "streamed": <the tokens as cf_on_token saw them>}
 *
 * The host calls cf_on_token once per generated token with its raw UTF-8
 * bytes (not JSON; a token may end mid-character); any non-zero answer stops
 * the decoder. The verdict travels back to the generating thread, so a real
 * model may deliver a token or two more; the text in infer_done is what was
 * generated. State that must survive between tokens lives in globals and
 * in the persistent arena, since scratch is reset before every call.
 */
#define TJ_ON_TOKEN
#include "tensorjob.h"

static uint64_t stop_after, tokens_seen;
static tj_str stop_at;
static int stopped;
static tj_buf streamed; /* persistent: every token as it arrived */

tj_cmd guest_init(tj_json input) {
    tj_str prompt = tj_get_str(input, "prompt");
    if (!prompt.ptr) prompt = TJ_STR("Write one sentence about the sea.");
    uint32_t max_tokens = (uint32_t)tj_get_u64(input, "max_tokens", 64);
    stop_after = tj_get_u64(input, "stop_after", 0);
    tj_str at = tj_get_str(input, "stop_at");
    stop_at = tj_keep(at.ptr ? at : TJ_STR("."));
    streamed = tj_buf_keep();
    return tj_infer(prompt, max_tokens);
}

int guest_on_token(tj_str token) {
    tokens_seen++;
    tj_buf_put(&streamed, token);
    if ((stop_after && tokens_seen >= stop_after) || (stop_at.len && tj_find(token, stop_at) >= 0)) {
        stopped = 1;
        return TJ_STOP;
    }
    return TJ_CONTINUE;
}

tj_cmd guest_step(tj_event ev) {
    if (ev.type != TJ_EV_INFER_DONE) return tj_failf("unsupported", "unexpected event %S", ev.name);
    return tj_done(tj_jsonf("{\"text\":%S,\"tokens_out\":%u,\"tokens_seen\":%llu,\"stopped\":%b,\"streamed\":%S}",
                            ev.text, ev.tokens_out, tokens_seen, stopped, tj_buf_str(&streamed)));
}
