"""classify.py -- label each line of a file, the label held to a shape while the model decodes.

Input:  {"path": "reviews.txt",
         "labels": ["positive", "negative", "neutral"],  # the label is one of these (the default), or
         "regex": "[1-5]",                               # the label matches this regex, or
         "grammar": "start: ...",                        # the label is a sentence of this Lark grammar
         "task": "What is the sentiment of this line?",  # the question asked of each line
         "max_lines": 100, "max_tokens": 32}             # all optional but path; at most 1000 lines
Result: {"path": ..., "lines": [{"line": 1, "label": "positive"}, ...],
         "counts": {"positive": 3, "negative": 1}}       # counts in the order the labels first came

One `infer` per non-blank line (blank lines are skipped but counted in the line
numbers), with `choices`, `regex` or `grammar`: whatever the model is, every
label it gives is one that was asked for. `max_tokens` bounds a regex or grammar
answer; labels get room for the longest. The C twin is classify.c.
"""

import tensorjob as tj

LABELS = ["positive", "negative", "neutral"]
TASK = "What is the sentiment of this line?"
MAX_LINES = 1000


def main(input):
    path = input.get("path") if isinstance(input, dict) else None
    if not isinstance(path, str):
        tj.fail("schema_validation_failed", 'input needs a "path" string')
    task = input.get("task", TASK)
    labels, regex, grammar = input.get("labels"), input.get("regex"), input.get("grammar")
    given = [kind for kind in (labels, regex, grammar) if kind is not None]
    if len(given) > 1:
        tj.fail("schema_validation_failed", "give one of labels, regex and grammar")
    if not given:
        labels = LABELS
    max_lines = input.get("max_lines", 100)
    if not isinstance(max_lines, int) or not 0 < max_lines <= MAX_LINES:
        max_lines = MAX_LINES
    if labels:  # room for the longest label (a token is at least one byte)
        max_tokens = max(len(label.encode()) for label in labels) + 4
        task += " Answer with one of: " + ", ".join(labels) + "."
    else:
        max_tokens = input.get("max_tokens", 32)
    lines, counts = [], {}
    with tj.open(path) as f:
        for number, line in enumerate(f, 1):
            text = line.rstrip("\r\n")
            if not text.strip():
                continue
            prompt = f"{task}\n\n{text}"
            label = tj.infer(prompt, max_tokens=max_tokens, choices=labels, regex=regex, grammar=grammar).text
            lines.append({"line": number, "label": label})
            counts[label] = counts.get(label, 0) + 1
            if len(lines) == max_lines:
                break
            tj.emit(done=f.tell(), total=f.size)
    return {"path": path, "lines": lines, "counts": counts}
