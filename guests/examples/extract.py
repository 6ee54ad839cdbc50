"""extract.py -- structured extraction: facts from a document, as JSON that validates.

Input:  {"path": "report.txt", "schema": {...JSON Schema...}, "window": 4096, "max_tokens": 384,
         "quote": false}
        (all but path are optional; the default schema asks for a title, a year and a
        few keywords; "quote": true copies every plain string field from the window read)
Result: {"path": ..., "facts": <the model's answer, parsed: valid against the schema>}

One `slice` of the document's beginning, one `infer` with a "format": the host
constrains decoding with a grammar made from the schema, so the text that comes
back always parses and validates. The same job as extract.c, command for command:
the two replay each other's runs.
"""

import tensorjob as tj

DEFAULT_SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 80},
        "year": {"type": "integer"},
        "keywords": {"type": "array", "items": {"type": "string", "maxLength": 30}, "minItems": 1, "maxItems": 5},
    },
    "required": ["title", "year", "keywords"],
    "additionalProperties": False,
}
PROMPT = "Read the document and answer with its facts as JSON.\n\n<document>\n{text}\n</document>"


def main(input):
    path = input.get("path") if isinstance(input, dict) else None
    if not isinstance(path, str):
        tj.fail("schema_validation_failed", 'input needs a "path" string')
    schema = input.get("schema") or DEFAULT_SCHEMA
    with tj.open(path) as f:
        if f.kind != "text":
            tj.fail("unsupported", f"{path} is not text")
        text = f.read(input.get("window", 4096))
    fmt = {"type": "json_schema", "name": "facts", "schema": schema}
    if input.get("quote") is True:
        fmt["quote"] = True
    reply = tj.infer(PROMPT.format(text=text), max_tokens=input.get("max_tokens", 384), format=fmt)
    return {"path": path, "facts": reply.json()}
