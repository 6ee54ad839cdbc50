"""pdf_summary.py -- summarise a PDF page by page (the Python twin of pdf_summary.c).

Input:  {"path": "report.pdf", "max_tokens": 32, "max_chars": 1500}
        (max_tokens per page summary and max_chars, the most bytes of a
        page's text put in a prompt, are optional)
  or    {"url": "https://example.org/report.pdf", ...} to fetch it instead
        (the job must grant the URL: --fetch https://example.org/)
Result: {"source": ..., "pages": n, "summarised": k, "skipped": m,
         "summaries": [{"page": 0, "summary": "..."},
                       {"page": 2, "skipped": "page 2 has no text layer ..."}, ...]}

A page without text (a scan) is recorded and skipped, not a failure of the
job; a file that is not a PDF fails the job with `unsupported`.
"""

import tensorjob as tj

PROMPT = ("Summarise page {page} of {pages} of a document in one short sentence.\n"
          "<page>\n{text}\n</page>\nSummary:")


def utf8_prefix(text, limit):
    """The longest prefix of ``text`` that is at most ``limit`` bytes of UTF-8."""
    return text.encode("utf-8")[:limit].decode("utf-8", "ignore")


def main(input):
    input = input if isinstance(input, dict) else {}
    path, url = input.get("path"), input.get("url")
    if not isinstance(path, str) and not isinstance(url, str):
        tj.fail("schema_validation_failed", 'input needs a "path" or a "url" string')
    max_tokens = input.get("max_tokens", 32)
    max_chars = input.get("max_chars", 1500)
    source = path if isinstance(path, str) else url
    doc = tj.open(source) if isinstance(path, str) else tj.fetch(source)
    if doc.kind != "document":
        tj.fail("unsupported", f"{source} is not a PDF the host can read (it opened as {doc.kind})")
    summaries = []
    for page in range(doc.pages):
        text = (doc.page_text_opt(page) or "").strip()
        if not text:
            summaries.append({"page": page, "skipped": doc.last_error or "no text"})
        else:
            reply = tj.infer(PROMPT.format(page=page + 1, pages=doc.pages, text=utf8_prefix(text, max_chars)),
                             max_tokens=max_tokens)
            summaries.append({"page": page, "summary": reply.text.strip()})
        tj.emit(done=page + 1, total=doc.pages)
    summarised = sum(1 for s in summaries if "summary" in s)
    return {"source": source, "pages": doc.pages, "summarised": summarised,
            "skipped": len(summaries) - summarised, "summaries": summaries}
