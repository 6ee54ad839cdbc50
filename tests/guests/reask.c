/* reask.c -- asks for a name with logprobs, and asks again (once) when the model was unsure of it.
 * Result: {"answer": <the model's JSON>, "confidence": c or null, "asks": 1 or 2, "tokens": N} */
#include "tensorjob.h"

static int asks;

static tj_cmd ask(void) {
    asks++;
    return tj_infer_with(tj_s(asks == 1 ? "Who wrote it?" : "Who wrote it? Read again, carefully."), 24,
        tj_jsonf("{\"format\":{\"type\":\"json_schema\",\"name\":\"who\",\"schema\":{\"type\":\"object\","
                 "\"properties\":{\"name\":{\"type\":\"string\"}},\"required\":[\"name\"]}},"
                 "\"logprobs\":true,\"top_logprobs\":2}"));
}

tj_cmd guest_init(tj_json input) { (void)input; return ask(); }

tj_cmd guest_step(tj_event ev) {
    if (ev.type != TJ_EV_INFER_DONE) return tj_fail("unsupported", tj_s("unexpected event"));
    size_t tokens = 0;
    tj_iter it = tj_iter_of(ev.logprobs);
    tj_str key; tj_json val;
    while (tj_next(&it, &key, &val)) tokens++;
    tj_json name = tj_get(ev.confidence, "name");
    double confidence = tj_as_f64(name, -1);
    if (confidence >= 0 && confidence < 0.5 && asks < 2) return ask();
    return tj_done(tj_jsonf("{\"answer\":%j,\"confidence\":%j,\"asks\":%d,\"tokens\":%zu}", tj_parse(ev.text),
                            tj_kind(name) == '0' ? name : tj_parse(tj_s("null")), asks, tokens));
}
