"""wordcount.py -- count the words and bytes of a file of any size (the Python twin of wordcount.c).

Input:  {"path": "notes.txt", "window": 65536}   (window optional)
Result: {"path": ..., "words": N, "bytes": M}

The file never enters the guest whole: it is read one window at a time
(each window a `slice` command the host checks and caps), and only two
counters and an "inside a word" flag are carried from one window to the
next. Words are runs of non-whitespace, ASCII whitespace as str.split()
sees it. Progress is emitted after the first window, then every 16th.
"""

import re

import tensorjob as tj

SPACE = " \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f"
WORD = re.compile(f"[^{re.escape(SPACE)}]+")


def main(input):
    path = input.get("path") if isinstance(input, dict) else None
    if not isinstance(path, str):
        tj.fail("schema_validation_failed", 'input needs a "path" string')
    window = input.get("window") or 65536
    words = size = windows = 0
    in_word = False  # the last window ended inside a word
    with tj.open(path) as f:
        if f.kind != "text":
            tj.fail("unsupported", f"{path} is not text")
        for text in f.windows(window):
            words += len(WORD.findall(text))
            if in_word and text[:1] not in SPACE:
                words -= 1  # the word goes on from the last window
            in_word = text[-1:] not in SPACE
            size += len(text.encode("utf-8"))
            windows += 1
            if windows % 16 == 1 and f.tell() < f.size:
                tj.emit(done=f.tell(), total=f.size)
    return {"path": path, "words": words, "bytes": size}
