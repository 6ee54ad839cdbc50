/*
 * stream.c -- stream output with the wasi:tensor/host functions.
 *
 * Input:  {"lines": 0, "chunk": 65536}   (both optional)
 * Staged input (input_bytes): echoed back first, in chunks of `chunk` bytes.
 * Then `lines` numbered lines "line 1\n", "line 2\n", ... are streamed.
 * Result: {"bytes": <bytes streamed>, "chunks": <emit-chunk calls>, "input_bytes": <staged input size>}
 *
 * Each step streams one chunk and returns an `emit` of progress, so the host
 * gets control back between chunks (to cancel, or to show progress) instead
 * of the guest streaming everything inside one long call. `read-input` always
 * copies from the start of the staged input, so the guest reads it once into
 * persistent memory. emit-chunk's errors end the job: -1 (streaming
 * disabled) as unsupported, -2 (over a cap) as limit_exceeded, -3 (nobody
 * listening, or the job was cancelled) as cancelled.
 */
#include "tensorjob.h"

static tj_str input;      /* the staged input, kept */
static uint64_t sent_input, lines, next_line = 1, chunk, bytes, chunks, total;

static tj_cmd finish(void) {
    tj_flush();
    return tj_done(tj_jsonf("{\"bytes\":%llu,\"chunks\":%llu,\"input_bytes\":%zu}", bytes, chunks, input.len));
}

/* Stream the next piece; returns the next command. */
static tj_cmd stream_next(void) {
    tj_buf piece = tj_buf_new();
    if (sent_input < input.len) {
        uint64_t n = input.len - sent_input;
        if (n > chunk) n = chunk;
        tj_buf_write(&piece, input.ptr + sent_input, (size_t)n);
        sent_input += n;
    } else {
        /* As many whole lines as fit in one chunk (at least one). */
        while (next_line <= lines) {
            tj_str line = tj_strf("line %llu\n", next_line);
            if (piece.len && piece.len + line.len > chunk) break;
            tj_buf_put(&piece, line);
            next_line++;
        }
    }
    if (piece.len == 0) return finish();
    int32_t rc = tj_emit_chunk(tj_buf_str(&piece));
    if (rc == TJ_STREAM_DISABLED) return tj_fail("unsupported", TJ_STR("streaming output is disabled for this job"));
    if (rc == TJ_STREAM_REJECTED) return tj_failf("limit_exceeded", "emit-chunk refused %zu bytes", piece.len);
    if (rc != 0) return tj_failf("cancelled", "emit-chunk returned %d: nobody is listening", rc);
    bytes += piece.len;
    chunks++;
    return tj_progress(bytes, total);
}

tj_cmd guest_init(tj_json in) {
    lines = tj_get_u64(in, "lines", 0);
    chunk = tj_get_u64(in, "chunk", 65536);
    if (chunk == 0 || chunk > 65536) chunk = 65536;
    input = tj_keep(tj_input_bytes());
    total = input.len;
    for (uint64_t i = 1; i <= lines; i++) total += tj_strf("line %llu\n", i).len;
    return stream_next();
}

tj_cmd guest_step(tj_event ev) {
    if (ev.type != TJ_EV_EMITTED) return tj_failf("unsupported", "unexpected event %S", ev.name);
    return stream_next();
}
