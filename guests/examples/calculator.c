/*
 * calculator.c -- a tool call: the model picks a function and its arguments, the guest runs it.
 *
 * Input:  {"question": "What is 12 times 7?", "max_tokens": 128}
 * Result: {"question": ..., "call": {"name": "add"|"multiply", "arguments": {"a": x, "b": y}},
 *          "value": <the function's result>, "answer": <the model's sentence about it>}
 *
 * The first `infer` offers two functions with "tool_choice": "required", so the model
 * must call one (the host holds it to a grammar of the two calls); infer_done carries
 * `tool_calls`. The guest computes the value itself -- the host never runs tools -- and
 * asks the model, in a second `infer`, to state the answer.
 */
#include "tensorjob.h"

static tj_str question, name;
static tj_json call;
static double value;
static int asked;

static const char TOOLS[] =
    "[{\"type\":\"function\",\"name\":\"add\",\"description\":\"Add two numbers: a + b\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"number\"},\"b\":{\"type\":\"number\"}},"
    "\"required\":[\"a\",\"b\"]}},"
    "{\"type\":\"function\",\"name\":\"multiply\",\"description\":\"Multiply two numbers: a * b\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"number\"},\"b\":{\"type\":\"number\"}},"
    "\"required\":[\"a\",\"b\"]}}]";

tj_cmd guest_init(tj_json input) {
    tj_str q = tj_get_str(input, "question");
    if (!q.ptr) return tj_fail("schema_validation_failed", TJ_STR("input needs a \"question\" string"));
    question = tj_keep(q);
    return tj_infer_with(question, (uint32_t)tj_get_u64(input, "max_tokens", 128),
                         tj_jsonf("{\"tools\":%j,\"tool_choice\":\"required\"}",
                                  (tj_json){TOOLS, sizeof TOOLS - 1}));
}

tj_cmd guest_step(tj_event ev) {
    if (ev.type != TJ_EV_INFER_DONE) return tj_failf("unsupported", "unexpected event %S", ev.name);
    if (!asked) {
        asked = 1;
        if (!ev.tool_calls.ptr) return tj_fail("script_error", TJ_STR("the model did not call a function"));
        tj_iter it = tj_iter_of(ev.tool_calls);
        tj_str key;
        tj_json first;
        if (!tj_next(&it, &key, &first)) return tj_fail("script_error", TJ_STR("no tool call"));
        name = tj_keep(tj_get_str(first, "name"));
        tj_json args = tj_parse(tj_get_str(first, "arguments"));
        double a = tj_get_f64(args, "a", 0), b = tj_get_f64(args, "b", 0);
        value = tj_eq(name, "add") ? a + b : a * b;
        call = tj_keep_json(tj_jsonf("{\"name\":%S,\"arguments\":%j}", name, args));
        return tj_infer(tj_strf("Question: %S\nThe %S function returned %f. Answer the question in one short sentence.",
                                question, name, value),
                        48);
    }
    return tj_done(tj_jsonf("{\"question\":%S,\"call\":%j,\"value\":%f,\"answer\":%S}", question, call, value,
                            tj_trim(ev.text)));
}
