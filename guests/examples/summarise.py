"""summarise.py -- the summariser, in Python: summarise a document one window at a time.

Input:  {"path": "report.txt", "window": 4096, "max_tokens": 128}
        (window, in bytes, and max_tokens are optional)
Result: {"path": ..., "windows": n, "summary": "<one summary per window, joined by newlines>"}

For each window: read it (`slice`), ask the model once with a prompt that
quotes it (`infer`), then report progress {"done": i, "total": n} (`emit`).
The same job as summarise.c, command for command: the two replay each
other's runs.
"""

import tensorjob as tj

PROMPT = ("Summarise part {part} of {total} of the document {path} in one or two sentences.\n"
          "<document>\n{text}\n</document>\nSummary:")


def main(input):
    path = input.get("path") if isinstance(input, dict) else None
    if not isinstance(path, str):
        tj.fail("schema_validation_failed", 'input needs a "path" string')
    window = input.get("window") or 4096
    max_tokens = input.get("max_tokens", 128)
    summaries = []
    with tj.open(path) as f:
        if f.kind != "text":
            tj.fail("unsupported", f"{path} is not text")
        total = -(-f.size // window)
        for part, text in enumerate(f.windows(window), start=1):
            reply = tj.infer(PROMPT.format(part=part, total=max(total, part), path=path, text=text),
                             max_tokens=max_tokens)
            summaries.append(reply.text.strip())
            if f.tell() >= f.size:
                total = part
            elif total < part + 1:
                total = part + -(-(f.size - f.tell()) // window)
            tj.emit(done=part, total=total)
    return {"path": path, "windows": len(summaries), "summary": "\n".join(summaries)}
