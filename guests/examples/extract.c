/*
 * extract.c -- structured extraction: facts from a document, as JSON that validates.
 *
 * Input:  {"path": "report.txt", "schema": {...JSON Schema...}, "window": 4096, "max_tokens": 384,
 *          "quote": false}
 *         (all but path are optional; the default schema asks for a title, a year and a
 *         few keywords; "quote": true copies every plain string field from the window read)
 * Result: {"path": ..., "facts": <the model's answer, parsed: valid against the schema>}
 *
 * One `slice` of the document's beginning, one `infer` with a "format": the host
 * constrains decoding with a grammar made from the schema, so the text that comes
 * back always parses and validates; the guest reads it with tj_parse.
 */
#include "tensorjob.h"

static tj_str path;
static tj_json schema;
static uint32_t max_tokens;
static uint64_t window;
static int quote;

static const char DEFAULT_SCHEMA[] =
    "{\"type\":\"object\",\"properties\":{"
    "\"title\":{\"type\":\"string\",\"maxLength\":80},"
    "\"year\":{\"type\":\"integer\"},"
    "\"keywords\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":30},\"minItems\":1,\"maxItems\":5}},"
    "\"required\":[\"title\",\"year\",\"keywords\"],\"additionalProperties\":false}";

tj_cmd guest_init(tj_json input) {
    tj_str p = tj_get_str(input, "path");
    if (!p.ptr) return tj_fail("schema_validation_failed", TJ_STR("input needs a \"path\" string"));
    path = tj_keep(p);
    tj_json s = tj_get(input, "schema");
    schema = s.ptr ? tj_keep_json(s) : (tj_json){DEFAULT_SCHEMA, sizeof DEFAULT_SCHEMA - 1};
    max_tokens = (uint32_t)tj_get_u64(input, "max_tokens", 384);
    window = tj_get_u64(input, "window", 4096);
    quote = tj_get_bool(input, "quote", 0);
    return tj_open(path);
}

tj_cmd guest_step(tj_event ev) {
    switch (ev.type) {
    case TJ_EV_OPENED:
        if (!tj_eq(ev.kind, "text")) return tj_failf("unsupported", "%S is not text", path);
        return tj_slice(ev.handle, 0, window);
    case TJ_EV_SLICED: {
        tj_str prompt = tj_strf("Read the document and answer with its facts as JSON.\n\n<document>\n%S\n</document>",
                                ev.text);
        /* "quote" is sent only when asked, as extract.py sends it: the two replay each other's runs */
        return tj_infer_with(prompt, max_tokens,
                             quote ? tj_jsonf("{\"format\":{\"type\":\"json_schema\",\"name\":\"facts\","
                                              "\"schema\":%j,\"quote\":true}}", schema)
                                   : tj_jsonf("{\"format\":{\"type\":\"json_schema\",\"name\":\"facts\","
                                              "\"schema\":%j}}", schema));
    }
    case TJ_EV_INFER_DONE:
        return tj_done(tj_jsonf("{\"path\":%S,\"facts\":%j}", path, tj_parse(ev.text)));
    default:
        return tj_failf("unsupported", "unexpected event %S", ev.name);
    }
}
