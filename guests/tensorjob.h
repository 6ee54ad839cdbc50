/*
 * tensorjob.h -- single-header C SDK for tensor-job guests.
 *
 * A guest is a wasm32 module that speaks the cuttlefish proc-block ABI: the
 * host hands it JSON (the job input, then one event per step), it answers with
 * a JSON command (infer, open, slice, emit, done, ...). This header implements
 * the whole ABI for freestanding wasm32 (no libc), so a guest is one .c file:
 *
 *     #include "tensorjob.h"
 *
 *     tj_cmd guest_init(tj_json input) {            // cf_init: the job input
 *         return tj_open(tj_get_str(input, "path"));
 *     }
 *     tj_cmd guest_step(tj_event ev) {              // cf_step: one event
 *         if (ev.type == TJ_EV_OPENED) return tj_slice(ev.handle, 0, 65536);
 *         if (ev.type == TJ_EV_SLICED)
 *             return tj_done(tj_jsonf("{\"bytes\":%zu}", ev.text.len));
 *         return tj_fail("unsupported", tj_s("unexpected event"));
 *     }
 *
 * Compile: python -m tensorjob_jupyter.compile guest.c (or compile.load_guest),
 * i.e. `zig cc --target=wasm32-freestanding -Os -nostdlib -Wl,--no-entry ...`.
 * The header holds the implementation (and memcpy/memset/memmove/memcmp, which
 * clang may call): include it in exactly one .c file of a guest.
 *
 * ENTRY POINTS the guest defines
 *   tj_cmd guest_init(tj_json input);    required
 *   tj_cmd guest_step(tj_event ev);      required
 *   int    guest_on_token(tj_str token); optional: `#define TJ_ON_TOKEN` before
 *          the #include. Gets raw UTF-8 token bytes (a token may end mid
 *          character). Return TJ_CONTINUE (0) or TJ_STOP (1).
 *   `#define TJ_SIGNATURE_INPUT "{path: text}"` and TJ_SIGNATURE_OUTPUT before
 *   the #include to export cf_signature.
 *
 * MEMORY: two arenas, and one rule.
 *   scratch    tj_alloc(n). Reset every time the host calls cf_alloc, i.e.
 *              before every cf_init/cf_step/cf_on_token. The input, the event,
 *              every string read from them, every command and tj_jsonf/tj_strf
 *              result live here. This keeps memory FLAT: a job that walks a
 *              64 GiB file in 64 KiB windows uses the memory of one window.
 *   persistent tj_keep_alloc(n), tj_keep(str), tj_keep_json(v), tj_buf_keep().
 *              Never freed. (Both arenas take 64 KiB chunks from memory.grow;
 *              #define TJ_CHUNK_BYTES to change that.)
 *   RULE: anything from an event or the input that you need in a LATER step
 *   must be copied with tj_keep() (or folded into globals/counters).
 *   Out of memory (the host's memory limit) traps the guest.
 *
 * TYPES
 *   tj_str   {ptr,len}: bytes (UTF-8 text). Strings this SDK makes are also
 *            NUL-terminated. tj_s("c string"), TJ_STR("literal").
 *   tj_json  {ptr,len}: the text of one JSON value; ptr == NULL: absent.
 *   tj_cmd   a finished command (JSON text in scratch).
 *   tj_event a parsed event: .type (TJ_EV_*) and its fields (see below).
 *
 * READING JSON (the job input; ev.json for anything unusual)
 *   tj_get(obj, "key")           member of an object (top level only)
 *   tj_get_str(obj, "key")       unescaped string, or {NULL,0}
 *   tj_get_u64(obj, "key", dflt) unsigned integer, or dflt
 *   tj_get_i64 / tj_get_f64 / tj_get_bool (obj, "key", dflt)
 *   tj_as_str / tj_as_u64 / tj_as_i64 / tj_as_f64 / tj_as_bool (value, ...)
 *   tj_kind(v): '"' '{' '[' 'n' 't' 'f' '0' (number) or 0 (absent)
 *   tj_iter it = tj_iter_of(arr_or_obj); while (tj_next(&it, &key, &val)) ...
 *   strings: tj_eq(s, "lit"), tj_str_eq, tj_find(hay, needle), tj_index_of(s, c),
 *   tj_trim(s), tj_base64_decode(b64)
 *   tj_parse(text) -> tj_json    JSON held in a string (an infer's structured
 *                                 text, a tool call's arguments), for tj_get
 *
 * COMMANDS (each returns tj_cmd)
 *   tj_infer(prompt, max_tokens)  tj_infer_images(prompt, max, handles, n)
 *   tj_infer_with(prompt, max_tokens, options): options is a JSON object whose
 *                                 members join the command: "format" (structured
 *                                 output), "tools", "tool_choice", and sampling
 *                                 ("temperature", "top_p", "top_k", "min_p",
 *                                 "repeat_penalty", "seed", "stop"), e.g.
 *     tj_infer_with(p, 128, tj_jsonf("{\"format\":{\"type\":\"json_schema\","
 *                   "\"name\":\"facts\",\"schema\":%j}}", schema))
 *                                 -> TJ_EV_INFER_DONE: ev.text is JSON valid
 *                                 against the schema (tj_parse(ev.text) reads
 *                                 it); after a tool call ev.tool_calls is
 *                                 [{"call_id","name","arguments"}], arguments
 *                                 being JSON text (tj_parse it too).
 *   The answer held to a shape while the model decodes (ev.text always fits):
 *   tj_infer_regex(prompt, max_tokens, regex)        the whole answer matches
 *                                 the regular expression (Rust regex syntax)
 *   tj_infer_choices(prompt, max_tokens, choices, n) the answer is one of the
 *                                 n strings (tj_str[]; compare with tj_str_eq)
 *   tj_infer_grammar(prompt, max_tokens, lark)       the answer is a sentence
 *                                 of the Lark grammar, from its `start` rule
 *     e.g. tj_infer_regex(p, 16, TJ_STR("[0-9]{4}-[0-9]{2}-[0-9]{2}"))
 *   (tj_infer_with's "regex", "choices" and "grammar" members.) One kind per
 *   infer, never with "stop"; what the host cannot enforce (a regex that does
 *   not parse, an undefined rule) fails the job schema_validation_failed.
 *   Leave max_tokens room for the whole answer: one cut short fails the job.
 *   tj_open(path)                 tj_slice(handle, offset, len)
 *   tj_slice_bytes(h, off, len)   tj_embed(texts, n)
 *   tj_emit(json)                 tj_progress(done, total) -> {"done":d,"total":t}
 *   tj_done(json)                 tj_fail(code, message)  tj_failf(code, fmt, ...)
 *   documents (pages count from 0; check ev.kind == "document" and
 *   ev.has_text_layer after opening):
 *   tj_page_text(h, page)         -> TJ_EV_PAGE_TEXTED; a page without text fails the job
 *   tj_page_text_opt(h, page)     -> TJ_EV_PAGE_TEXT_ATTEMPTED: ev.text, or ev.error
 *                                    (ev.error.ptr != NULL) and the job goes on
 *   tj_document_text(h)           -> TJ_EV_PAGE_TEXTED: every page, separated by '\f'
 *   tj_page_image(h, page)        -> TJ_EV_PAGE_IMAGED: ev.handle, a new PNG handle
 *   tj_image_resize(h, max_w, max_h)  (fit within, keep the aspect, never enlarge)
 *   tj_image_crop(h, x, y, w, hgt)    (refused if outside the image, not clamped)
 *                                 -> TJ_EV_PAGE_IMAGED: a new PNG handle
 *   tj_fetch(url)                 -> TJ_EV_OPENED, exactly like tj_open (needs a
 *                                    --fetch grant covering the URL)
 *
 * BUILDING TEXT AND JSON
 *   tj_jsonf(fmt, ...) -> tj_json   printf-like; %s (C string) and %S (tj_str)
 *        become quoted, escaped JSON strings; %j inserts a tj_json; %b a bool.
 *   tj_strf(fmt, ...)  -> tj_str    the same, but %s/%S are inserted raw.
 *   Conversions: %d %i %u %x (int), %ld %lu, %lld %llu (64-bit), %zu (size_t),
 *   %f (double), %c, %s, %S, %j, %b, %%.
 *   tj_buf: growable text: tj_buf_new() (scratch) / tj_buf_keep()
 *   (persistent); tj_buf_put, tj_buf_puts, tj_buf_putc, tj_buf_printf,
 *   tj_buf_str.
 *   Strings are escaped exactly: " \ and control characters (\n \r \t, the
 *   rest as \u00XX); valid UTF-8 passes through; invalid bytes become U+FFFD.
 *
 * STREAMING (wasi:tensor/host@0.1.0; imported only if you call them)
 *   tj_emit_chunk(bytes) -> 0 | TJ_STREAM_DISABLED (-1) | TJ_STREAM_REJECTED
 *   (-2, over a cap) | TJ_STREAM_CLOSED (-3, nobody listening/cancelled)
 *   tj_flush(), tj_input_len(), tj_read_input(dst, n), tj_input_bytes().
 */
#ifndef TENSORJOB_H
#define TENSORJOB_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#define TJ_SDK_VERSION "0.1.0"

#if !defined(__wasm32__)
#error "tensorjob.h targets wasm32 (zig cc --target=wasm32-freestanding)"
#endif

#define TJ_API static __attribute__((unused))
#define TJ_EXPORT(name) __attribute__((export_name(name), visibility("default")))
#define TJ_IMPORT(name) __attribute__((import_module("wasi:tensor/host@0.1.0"), import_name(name)))

#define TJ_CONTINUE 0
#define TJ_STOP 1

#define TJ_STREAM_OK 0
#define TJ_STREAM_DISABLED (-1)
#define TJ_STREAM_REJECTED (-2)
#define TJ_STREAM_CLOSED (-3)

/* ---------------------------------------------------------------- types -- */

typedef struct { const char *ptr; size_t len; } tj_str;
typedef struct { const char *ptr; size_t len; } tj_json;
typedef struct { const char *json; size_t len; } tj_cmd;

typedef enum {
    TJ_EV_UNKNOWN = 0,
    TJ_EV_INFER_DONE,   /* text, tokens_out */
    TJ_EV_OPENED,       /* handle, len, kind ("text"|"binary"|"image"|...), format */
    TJ_EV_SLICED,       /* text, next_offset: resume from next_offset */
    TJ_EV_SLICED_BYTES, /* bytes_base64 (tj_base64_decode), next_offset */
    TJ_EV_EMBEDDED,     /* vectors: JSON array of arrays of numbers */
    TJ_EV_EMITTED,      /* no fields */
    TJ_EV_PAGE_TEXTED,  /* text: one page (page_text) or every page (document_text) */
    TJ_EV_PAGE_TEXT_ATTEMPTED, /* text, or error (error.ptr != NULL when the page could not be read) */
    TJ_EV_PAGE_IMAGED   /* handle (a new PNG), len */
} tj_event_type;

typedef struct {
    tj_event_type type;
    tj_str name;          /* the "event" tag as sent */
    tj_json json;         /* the whole event object */
    tj_str text;          /* infer_done, sliced (unescaped) */
    uint32_t tokens_out;  /* infer_done */
    uint32_t handle;      /* opened, page_imaged */
    uint64_t len;         /* opened, page_imaged: size in bytes */
    tj_str kind;          /* opened: kind.kind */
    tj_str format;        /* opened: kind.format (images) */
    uint32_t pages;       /* opened: kind.pages (documents) */
    int has_text_layer;   /* opened: kind.has_text_layer (documents) */
    tj_str error;         /* page_text_attempted: why the page could not be read; ptr NULL if it was */
    uint64_t next_offset; /* sliced, sliced_bytes */
    tj_str bytes_base64;  /* sliced_bytes */
    tj_json vectors;      /* embedded */
    tj_json tool_calls;   /* infer_done: [{"call_id","name","arguments"}] when the model called a tool; ptr NULL otherwise */
    tj_json logprobs;     /* infer_done: [{"token","logprob","bytes","top_logprobs","runner_up_logprob"}] per token when
                             the infer asked ("logprobs": true) and the model gave them; ptr NULL otherwise */
    tj_json confidence;   /* infer_done: {"FIELD": 0..1 or null} by dotted path for an answer with fields, beside
                             logprobs (docs/guests.md, "Confidence"); ptr NULL otherwise */
} tj_event;

typedef struct tj__chunk {
    struct tj__chunk *next;
    size_t size; /* usable bytes after the header */
    size_t used;
} tj__chunk;

typedef struct { tj__chunk *head, *cur; } tj_arena;

typedef struct {
    char *ptr;
    size_t len, cap;
    tj_arena *arena;
} tj_buf;

typedef struct {
    const char *p, *end;
    char close;
} tj_iter;

/* The guest's entry points. */
tj_cmd guest_init(tj_json input);
tj_cmd guest_step(tj_event ev);
#ifdef TJ_ON_TOKEN
int guest_on_token(tj_str token);
#endif

/* --------------------------------------------- libc pieces clang may call -- */

void *memcpy(void *restrict dst, const void *restrict src, size_t n) {
    unsigned char *d = (unsigned char *)dst;
    const unsigned char *s = (const unsigned char *)src;
    while (n--) *d++ = *s++;
    return dst;
}
void *memmove(void *dst, const void *src, size_t n) {
    unsigned char *d = (unsigned char *)dst;
    const unsigned char *s = (const unsigned char *)src;
    if (d < s) {
        while (n--) *d++ = *s++;
    } else {
        while (n--) d[n] = s[n];
    }
    return dst;
}
void *memset(void *dst, int c, size_t n) {
    unsigned char *d = (unsigned char *)dst;
    while (n--) *d++ = (unsigned char)c;
    return dst;
}
int memcmp(const void *a, const void *b, size_t n) {
    const unsigned char *x = (const unsigned char *)a, *y = (const unsigned char *)b;
    for (; n; n--, x++, y++)
        if (*x != *y) return *x - *y;
    return 0;
}

TJ_API size_t tj_strlen(const char *s) {
    size_t n = 0;
    if (!s) return 0;
    while (s[n]) n++;
    return n;
}

#define TJ_STR(lit) ((tj_str){(lit), sizeof(lit) - 1})
TJ_API tj_str tj_s(const char *cstr) { return (tj_str){cstr, tj_strlen(cstr)}; }
TJ_API int tj_eq(tj_str a, const char *cstr) {
    size_t n = tj_strlen(cstr);
    return a.ptr && a.len == n && memcmp(a.ptr, cstr, n) == 0;
}
TJ_API int tj_str_eq(tj_str a, tj_str b) { return a.len == b.len && (a.len == 0 || memcmp(a.ptr, b.ptr, a.len) == 0); }
/* Index of the first `c` in `s`, or -1. */
TJ_API long tj_index_of(tj_str s, char c) {
    for (size_t i = 0; i < s.len; i++)
        if (s.ptr[i] == c) return (long)i;
    return -1;
}

/* Index of the first occurrence of `needle` in `hay`, or -1. */
TJ_API long tj_find(tj_str hay, tj_str needle) {
    if (needle.len == 0) return 0;
    for (size_t i = 0; i + needle.len <= hay.len; i++)
        if (hay.ptr[i] == needle.ptr[0] && memcmp(hay.ptr + i, needle.ptr, needle.len) == 0) return (long)i;
    return -1;
}
/* `s` without leading and trailing ASCII whitespace (a view, not a copy). */
TJ_API tj_str tj_trim(tj_str s) {
    while (s.len && (s.ptr[0] == ' ' || (s.ptr[0] >= '\t' && s.ptr[0] <= '\r'))) { s.ptr++; s.len--; }
    while (s.len && (s.ptr[s.len - 1] == ' ' || (s.ptr[s.len - 1] >= '\t' && s.ptr[s.len - 1] <= '\r'))) s.len--;
    return s;
}

/* --------------------------------------------------------------- memory -- */

extern unsigned char __heap_base;

static tj_arena tj__scratch_arena, tj__keep_arena;
static uintptr_t tj__brk;

#ifndef TJ_CHUNK_BYTES
#define TJ_CHUNK_BYTES 65536u
#endif

/* Carve `bytes` from the end of the heap, growing linear memory as needed. */
static void *tj__grab(size_t bytes) {
    if (!tj__brk) tj__brk = ((uintptr_t)&__heap_base + 15) & ~(uintptr_t)15;
    uintptr_t limit = (uintptr_t)__builtin_wasm_memory_size(0) * 65536u;
    if (bytes > 0x7fffffffu - tj__brk) __builtin_trap();
    if (tj__brk + bytes > limit) {
        size_t pages = (tj__brk + bytes - limit + 65535u) / 65536u;
        if (__builtin_wasm_memory_grow(0, pages) == (size_t)-1) __builtin_trap(); /* out of memory */
    }
    void *p = (void *)tj__brk;
    tj__brk += (bytes + 15) & ~(size_t)15;
    return p;
}

static tj__chunk *tj__new_chunk(size_t need) {
    size_t size = need > TJ_CHUNK_BYTES ? need : TJ_CHUNK_BYTES;
    size = (size + sizeof(tj__chunk) + 65535u) / 65536u * 65536u - sizeof(tj__chunk);
    tj__chunk *c = (tj__chunk *)tj__grab(size + sizeof(tj__chunk));
    c->next = 0;
    c->size = size;
    c->used = 0;
    return c;
}

#define TJ__DATA(c) ((char *)(c) + sizeof(tj__chunk))

static void *tj__arena_alloc(tj_arena *a, size_t n) {
    if (!a->cur) a->head = a->cur = tj__new_chunk(n);
    for (;;) {
        tj__chunk *c = a->cur;
        size_t off = (c->used + 7) & ~(size_t)7;
        if (off <= c->size && n <= c->size - off) {
            c->used = off + n;
            return TJ__DATA(c) + off;
        }
        if (!c->next) c->next = tj__new_chunk(n);
        a->cur = c->next;
        a->cur->used = 0; /* chunks past `cur` hold nothing live */
    }
}

/* Grow the most recent allocation `p` (of `old` bytes) in place, if it fits. */
static int tj__arena_extend(tj_arena *a, void *p, size_t old, size_t n) {
    tj__chunk *c = a->cur;
    if (!c || (char *)p + old != TJ__DATA(c) + c->used) return 0;
    size_t off = (size_t)((char *)p - TJ__DATA(c));
    if (n > c->size - off) return 0;
    c->used = off + n;
    return 1;
}

static void tj__arena_reset(tj_arena *a) {
    if (!a->head) return;
    a->cur = a->head;
    a->head->used = 0;
}

/* Scratch memory: valid until the host's next cf_alloc (the next step). */
TJ_API void *tj_alloc(size_t n) { return tj__arena_alloc(&tj__scratch_arena, n); }
/* Persistent memory: valid for the rest of the job. */
TJ_API void *tj_keep_alloc(size_t n) { return tj__arena_alloc(&tj__keep_arena, n); }

TJ_API tj_str tj__copy(tj_arena *a, tj_str s) {
    char *p = (char *)tj__arena_alloc(a, s.len + 1);
    if (s.len) memcpy(p, s.ptr, s.len);
    p[s.len] = 0;
    return (tj_str){s.ptr ? p : 0, s.len};
}
/* Copy a string into persistent memory (NUL-terminated). */
TJ_API tj_str tj_keep(tj_str s) { return tj__copy(&tj__keep_arena, s); }
TJ_API tj_json tj_keep_json(tj_json v) {
    tj_str s = tj__copy(&tj__keep_arena, (tj_str){v.ptr, v.len});
    return (tj_json){s.ptr, s.len};
}

/* ------------------------------------------------------------------ tj_buf -- */

TJ_API tj_buf tj_buf_new(void) { return (tj_buf){0, 0, 0, &tj__scratch_arena}; }
TJ_API tj_buf tj_buf_keep(void) { return (tj_buf){0, 0, 0, &tj__keep_arena}; }

static void tj__buf_reserve(tj_buf *b, size_t extra) {
    size_t need = b->len + extra + 1; /* room for the NUL */
    if (need <= b->cap) return;
    if (!b->arena) b->arena = &tj__scratch_arena;
    size_t cap = b->cap ? b->cap * 2 : 64;
    while (cap < need) cap *= 2;
    if (b->ptr && tj__arena_extend(b->arena, b->ptr, b->cap, cap)) {
        b->cap = cap;
        return;
    }
    char *p = (char *)tj__arena_alloc(b->arena, cap);
    if (b->len) memcpy(p, b->ptr, b->len);
    b->ptr = p;
    b->cap = cap;
}

TJ_API void tj_buf_write(tj_buf *b, const void *data, size_t n) {
    tj__buf_reserve(b, n);
    if (n) memcpy(b->ptr + b->len, data, n);
    b->len += n;
    b->ptr[b->len] = 0;
}
TJ_API void tj_buf_put(tj_buf *b, tj_str s) { tj_buf_write(b, s.ptr, s.len); }
TJ_API void tj_buf_puts(tj_buf *b, const char *s) { tj_buf_write(b, s, tj_strlen(s)); }
TJ_API void tj_buf_putc(tj_buf *b, char c) { tj_buf_write(b, &c, 1); }
TJ_API void tj_buf_clear(tj_buf *b) {
    b->len = 0;
    if (b->ptr) b->ptr[0] = 0;
}
TJ_API tj_str tj_buf_str(const tj_buf *b) { return (tj_str){b->ptr ? b->ptr : "", b->len}; }

TJ_API void tj_buf_u64(tj_buf *b, uint64_t v) {
    char tmp[20];
    int n = 0;
    do { tmp[n++] = (char)('0' + v % 10); v /= 10; } while (v);
    tj__buf_reserve(b, (size_t)n);
    while (n) b->ptr[b->len++] = tmp[--n];
    b->ptr[b->len] = 0;
}
TJ_API void tj_buf_i64(tj_buf *b, int64_t v) {
    if (v < 0) {
        tj_buf_putc(b, '-');
        tj_buf_u64(b, (uint64_t)0 - (uint64_t)v);
    } else {
        tj_buf_u64(b, (uint64_t)v);
    }
}

/* Length of the valid UTF-8 sequence at s[0..n), or 0 when it is invalid. */
static size_t tj__utf8_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; }
    else return 0;
    if (len > n) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) return 0;
    if (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) return 0;
    return len;
}

/* Append `s` as a quoted JSON string: exact escaping, U+FFFD for bad UTF-8. */
TJ_API void tj_buf_json_str(tj_buf *b, tj_str s) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *p = (const unsigned char *)s.ptr;
    size_t i = 0, run = 0;
    tj__buf_reserve(b, s.len + 2);
    tj_buf_putc(b, '"');
    while (i < s.len) {
        unsigned c = p[i];
        size_t n = 1;
        const char *esc = 0;
        char u[6];
        if (c == '"') esc = "\\\"";
        else if (c == '\\') esc = "\\\\";
        else if (c == '\n') esc = "\\n";
        else if (c == '\r') esc = "\\r";
        else if (c == '\t') esc = "\\t";
        else if (c < 0x20) {
            u[0] = '\\'; u[1] = 'u'; u[2] = '0'; u[3] = '0';
            u[4] = hex[c >> 4]; u[5] = hex[c & 15];
        } else if (c >= 0x80) {
            n = tj__utf8_len(p + i, s.len - i);
            if (!n) { esc = "\xEF\xBF\xBD"; n = 1; }
        }
        if (!esc && c >= 0x20) { run += n; i += n; continue; }
        if (run) tj_buf_write(b, p + i - run, run);
        run = 0;
        if (esc) tj_buf_puts(b, esc);
        else tj_buf_write(b, u, 6);
        i += n;
    }
    if (run) tj_buf_write(b, p + i - run, run);
    tj_buf_putc(b, '"');
}

static void tj__buf_f64(tj_buf *b, double x) {
    if (x != x || x > 1.7976931348623157e308 || x < -1.7976931348623157e308) {
        tj_buf_puts(b, "null"); /* JSON has no NaN or infinity */
        return;
    }
    if (x < 0) { tj_buf_putc(b, '-'); x = -x; }
    int exp10 = 0;
    if (x >= 1e15) { while (x >= 10) { x /= 10; exp10++; } }
    else if (x != 0 && x < 1e-5) { while (x < 1) { x *= 10; exp10--; } }
    uint64_t ip = (uint64_t)x;
    double frac = x - (double)ip;
    uint64_t f6 = (uint64_t)(frac * 1e6 + 0.5);
    if (f6 >= 1000000) { ip++; f6 -= 1000000; }
    tj_buf_u64(b, ip);
    if (f6) {
        char d[7];
        for (int k = 5; k >= 0; k--) { d[k] = (char)('0' + f6 % 10); f6 /= 10; }
        int n = 6;
        while (n > 0 && d[n - 1] == '0') n--;
        tj_buf_putc(b, '.');
        tj_buf_write(b, d, (size_t)n);
    }
    if (exp10) { tj_buf_putc(b, 'e'); tj_buf_i64(b, exp10); }
}

/* The formatter behind tj_jsonf / tj_strf / tj_buf_printf. */
static void tj__vfmt(tj_buf *b, int json, const char *fmt, va_list ap) {
    for (const char *f = fmt; *f; f++) {
        if (*f != '%') {
            const char *start = f;
            while (f[1] && f[1] != '%') f++;
            tj_buf_write(b, start, (size_t)(f - start + 1));
            continue;
        }
        f++;
        int longs = 0, size_t_arg = 0;
        while (*f == 'l') { longs++; f++; }
        if (*f == 'z') { size_t_arg = 1; f++; }
        switch (*f) {
        case 'd': case 'i': {
            int64_t v = longs >= 2 ? va_arg(ap, long long) : longs ? va_arg(ap, long)
                      : size_t_arg ? (int64_t)va_arg(ap, size_t) : va_arg(ap, int);
            tj_buf_i64(b, v);
            break;
        }
        case 'u': case 'x': {
            uint64_t v = longs >= 2 ? va_arg(ap, unsigned long long) : longs ? va_arg(ap, unsigned long)
                       : size_t_arg ? va_arg(ap, size_t) : va_arg(ap, unsigned);
            if (*f == 'u') tj_buf_u64(b, v);
            else {
                char tmp[16];
                int n = 0;
                do { tmp[n++] = "0123456789abcdef"[v & 15]; v >>= 4; } while (v);
                while (n) tj_buf_putc(b, tmp[--n]);
            }
            break;
        }
        case 'f': case 'g': tj__buf_f64(b, va_arg(ap, double)); break;
        case 'c': tj_buf_putc(b, (char)va_arg(ap, int)); break;
        case 'b': tj_buf_puts(b, va_arg(ap, int) ? "true" : "false"); break;
        case 's': case 'S': {
            tj_str s;
            if (*f == 's') {
                const char *c = va_arg(ap, const char *);
                s = (tj_str){c, tj_strlen(c)};
            } else {
                s = va_arg(ap, tj_str);
            }
            if (!json) tj_buf_put(b, s);
            else if (!s.ptr) tj_buf_puts(b, "null");
            else tj_buf_json_str(b, s);
            break;
        }
        case 'j': {
            tj_json v = va_arg(ap, tj_json);
            if (v.ptr && v.len) tj_buf_write(b, v.ptr, v.len);
            else tj_buf_puts(b, "null");
            break;
        }
        case '%': tj_buf_putc(b, '%'); break;
        case 0: return;
        default: tj_buf_putc(b, '%'); tj_buf_putc(b, *f); break;
        }
    }
}

TJ_API void tj_buf_printf(tj_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tj__vfmt(b, 0, fmt, ap);
    va_end(ap);
}
/* Text formatting into scratch: %s/%S inserted raw. */
TJ_API tj_str tj_strf(const char *fmt, ...) {
    tj_buf b = tj_buf_new();
    va_list ap;
    va_start(ap, fmt);
    tj__vfmt(&b, 0, fmt, ap);
    va_end(ap);
    return tj_buf_str(&b);
}
/* JSON formatting into scratch: %s/%S become quoted, escaped JSON strings. */
TJ_API tj_json tj_jsonf(const char *fmt, ...) {
    tj_buf b = tj_buf_new();
    va_list ap;
    va_start(ap, fmt);
    tj__vfmt(&b, 1, fmt, ap);
    va_end(ap);
    tj_str s = tj_buf_str(&b);
    return (tj_json){s.ptr, s.len};
}

/* ----------------------------------------------------------- reading JSON -- */

static const char *tj__ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    return p;
}

/* Past the end of the JSON string whose opening quote is at p. */
static const char *tj__skip_string(const char *p, const char *end) {
    for (p++; p < end; p++) {
        if (*p == '\\') p++;
        else if (*p == '"') return p + 1;
    }
    return end;
}

/* Past the end of the JSON value starting at p (which is not whitespace). */
static const char *tj__skip_value(const char *p, const char *end) {
    if (p >= end) return end;
    if (*p == '"') return tj__skip_string(p, end);
    if (*p == '{' || *p == '[') {
        int depth = 0;
        while (p < end) {
            char c = *p;
            if (c == '"') { p = tj__skip_string(p, end); continue; }
            if (c == '{' || c == '[') depth++;
            else if ((c == '}' || c == ']') && --depth == 0) return p + 1;
            p++;
        }
        return end;
    }
    while (p < end && *p != ',' && *p != '}' && *p != ']' && *p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
        p++;
    return p;
}

static tj_json tj__trim(const char *p, size_t n) {
    const char *end = p + n;
    p = tj__ws(p, end);
    if (p >= end) return (tj_json){0, 0};
    const char *e = tj__skip_value(p, end);
    return (tj_json){p, (size_t)(e - p)};
}

/* What kind of value: '"' '{' '[' 'n' 't' 'f' '0' (number), or 0 if absent. */
TJ_API char tj_kind(tj_json v) {
    if (!v.ptr || !v.len) return 0;
    char c = v.ptr[0];
    if (c == '-' || (c >= '0' && c <= '9')) return '0';
    return c;
}

/* Iterate the members of an object (key set) or the items of an array. */
TJ_API tj_iter tj_iter_of(tj_json v) {
    char k = tj_kind(v);
    if (k != '{' && k != '[') return (tj_iter){0, 0, 0};
    return (tj_iter){v.ptr + 1, v.ptr + v.len, k == '{' ? '}' : ']'};
}

static void tj__unescape_into(const char *s, size_t n, char *out, size_t *out_len);

/* Next item: *val (and, for objects, *key unescaped, if key != NULL). */
TJ_API int tj_next(tj_iter *it, tj_str *key, tj_json *val) {
    if (!it->p) return 0;
    const char *p = tj__ws(it->p, it->end);
    if (p < it->end && *p == ',') p = tj__ws(p + 1, it->end);
    if (p >= it->end || *p == it->close) { it->p = 0; return 0; }
    if (it->close == '}') {
        if (*p != '"') { it->p = 0; return 0; }
        const char *ke = tj__skip_string(p, it->end);
        if (key) {
            size_t raw = (size_t)(ke - p) >= 2 ? (size_t)(ke - p) - 2 : 0;
            char *k = (char *)tj_alloc(raw + 1);
            size_t kl;
            tj__unescape_into(p + 1, raw, k, &kl);
            *key = (tj_str){k, kl};
        }
        p = tj__ws(ke, it->end);
        if (p >= it->end || *p != ':') { it->p = 0; return 0; }
        p = tj__ws(p + 1, it->end);
    }
    const char *e = tj__skip_value(p, it->end);
    if (e == p) { it->p = 0; return 0; }
    *val = (tj_json){p, (size_t)(e - p)};
    it->p = e;
    return 1;
}

/* Does the raw (still escaped) key text equal `key`? */
static int tj__key_eq(const char *raw, size_t n, const char *key) {
    size_t kl = tj_strlen(key);
    int has_escape = 0;
    for (size_t i = 0; i < n; i++) if (raw[i] == '\\') { has_escape = 1; break; }
    if (!has_escape) return n == kl && memcmp(raw, key, n) == 0;
    char *tmp = (char *)tj_alloc(n + 1);
    size_t tl;
    tj__unescape_into(raw, n, tmp, &tl);
    return tl == kl && memcmp(tmp, key, kl) == 0;
}

/* The member `key` of object `obj` (top level only); {NULL,0} if absent. */
TJ_API tj_json tj_get(tj_json obj, const char *key) {
    tj_iter it = tj_iter_of(obj);
    if (it.close != '}') return (tj_json){0, 0};
    const char *p = it.p;
    for (;;) {
        p = tj__ws(p, it.end);
        if (p < it.end && *p == ',') p = tj__ws(p + 1, it.end);
        if (p >= it.end || *p != '"') break;
        const char *ke = tj__skip_string(p, it.end);
        int match = ke - p >= 2 && tj__key_eq(p + 1, (size_t)(ke - p) - 2, key);
        p = tj__ws(ke, it.end);
        if (p >= it.end || *p != ':') break;
        p = tj__ws(p + 1, it.end);
        const char *e = tj__skip_value(p, it.end);
        if (e == p) break;
        if (match) return (tj_json){p, (size_t)(e - p)};
        p = e;
    }
    return (tj_json){0, 0};
}

static int tj__hex4(const char *s, uint32_t *out) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (uint32_t)(c - 'A' + 10);
        else return 0;
    }
    *out = v;
    return 1;
}

static size_t tj__put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18)); o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Unescape JSON string contents s[0..n) into out (needs n+1 bytes). */
static void tj__unescape_into(const char *s, size_t n, char *out, size_t *out_len) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c != '\\' || i + 1 >= n) { out[o++] = c; continue; }
        c = s[++i];
        switch (c) {
        case 'n': out[o++] = '\n'; break;
        case 't': out[o++] = '\t'; break;
        case 'r': out[o++] = '\r'; break;
        case 'b': out[o++] = '\b'; break;
        case 'f': out[o++] = '\f'; break;
        case 'u': {
            uint32_t cp;
            if (i + 4 >= n || !tj__hex4(s + i + 1, &cp)) { out[o++] = '\\'; out[o++] = 'u'; break; }
            i += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                uint32_t lo;
                if (i + 6 < n && s[i + 1] == '\\' && s[i + 2] == 'u' && tj__hex4(s + i + 3, &lo) &&
                    lo >= 0xDC00 && lo <= 0xDFFF) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    i += 6;
                } else {
                    cp = 0xFFFD; /* lone high surrogate */
                }
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                cp = 0xFFFD; /* lone low surrogate */
            }
            o += tj__put_utf8(out + o, cp);
            break;
        }
        default: out[o++] = c; break; /* \" \\ \/ */
        }
    }
    out[o] = 0;
    *out_len = o;
}

/* The unescaped string (in scratch, NUL-terminated); {NULL,0} if not a string. */
TJ_API tj_str tj_as_str(tj_json v) {
    if (tj_kind(v) != '"' || v.len < 2) return (tj_str){0, 0};
    char *out = (char *)tj_alloc(v.len - 1);
    size_t n;
    tj__unescape_into(v.ptr + 1, v.len - 2, out, &n);
    return (tj_str){out, n};
}

/* A non-negative integer literal, or dflt (also for floats and overflow). */
TJ_API uint64_t tj_as_u64(tj_json v, uint64_t dflt) {
    if (tj_kind(v) != '0' || v.ptr[0] == '-') return dflt;
    uint64_t x = 0;
    for (size_t i = 0; i < v.len; i++) {
        char c = v.ptr[i];
        if (c < '0' || c > '9') return dflt;
        uint64_t d = (uint64_t)(c - '0');
        if (x > (UINT64_MAX - d) / 10) return dflt;
        x = x * 10 + d;
    }
    return x;
}

TJ_API int64_t tj_as_i64(tj_json v, int64_t dflt) {
    if (tj_kind(v) != '0') return dflt;
    int neg = v.ptr[0] == '-';
    uint64_t m = tj_as_u64((tj_json){v.ptr + neg, v.len - (size_t)neg}, UINT64_MAX);
    if (m == UINT64_MAX || m > (uint64_t)INT64_MAX + (uint64_t)neg) return dflt;
    return neg ? (int64_t)(0 - m) : (int64_t)m;
}

TJ_API double tj_as_f64(tj_json v, double dflt) {
    if (tj_kind(v) != '0') return dflt;
    const char *p = v.ptr, *end = v.ptr + v.len;
    int neg = 0, exp10 = 0, digits = 0;
    double m = 0;
    if (*p == '-') { neg = 1; p++; }
    for (; p < end && *p >= '0' && *p <= '9'; p++, digits++) m = m * 10 + (*p - '0');
    if (p < end && *p == '.')
        for (p++; p < end && *p >= '0' && *p <= '9'; p++, digits++) { m = m * 10 + (*p - '0'); exp10--; }
    if (!digits) return dflt;
    if (p < end && (*p == 'e' || *p == 'E')) {
        int eneg = 0, e = 0;
        p++;
        if (p < end && (*p == '+' || *p == '-')) eneg = *p++ == '-';
        for (; p < end && *p >= '0' && *p <= '9'; p++) if (e < 10000) e = e * 10 + (*p - '0');
        exp10 += eneg ? -e : e;
    }
    double scale = 1;
    int ae = exp10 < 0 ? -exp10 : exp10;
    double pw = 10;
    while (ae) { if (ae & 1) scale *= pw; pw *= pw; ae >>= 1; }
    m = exp10 < 0 ? m / scale : m * scale;
    return neg ? -m : m;
}

TJ_API int tj_as_bool(tj_json v, int dflt) {
    char k = tj_kind(v);
    return k == 't' ? 1 : k == 'f' ? 0 : dflt;
}

TJ_API tj_str tj_get_str(tj_json obj, const char *key) { return tj_as_str(tj_get(obj, key)); }
TJ_API uint64_t tj_get_u64(tj_json obj, const char *key, uint64_t dflt) { return tj_as_u64(tj_get(obj, key), dflt); }
TJ_API int64_t tj_get_i64(tj_json obj, const char *key, int64_t dflt) { return tj_as_i64(tj_get(obj, key), dflt); }
TJ_API double tj_get_f64(tj_json obj, const char *key, double dflt) { return tj_as_f64(tj_get(obj, key), dflt); }
TJ_API int tj_get_bool(tj_json obj, const char *key, int dflt) { return tj_as_bool(tj_get(obj, key), dflt); }

/* Decode standard base64 (sliced_bytes) into scratch; stops at the first bad char. */
TJ_API tj_str tj_base64_decode(tj_str b64) {
    unsigned char *out = (unsigned char *)tj_alloc(b64.len / 4 * 3 + 4);
    size_t o = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < b64.len; i++) {
        char c = b64.ptr[i];
        int v;
        if (c >= 'A' && c <= 'Z') v = c - 'A';
        else if (c >= 'a' && c <= 'z') v = c - 'a' + 26;
        else if (c >= '0' && c <= '9') v = c - '0' + 52;
        else if (c == '+') v = 62;
        else if (c == '/') v = 63;
        else break; /* '=' padding or garbage */
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) { bits -= 8; out[o++] = (unsigned char)(acc >> bits); }
    }
    out[o] = 0;
    return (tj_str){(const char *)out, o};
}

/* ---------------------------------------------------------------- events -- */

static tj_event tj__parse_event(tj_json ev) {
    tj_event e;
    memset(&e, 0, sizeof e);
    e.json = ev;
    e.name = tj_get_str(ev, "event");
    if (tj_eq(e.name, "infer_done")) {
        e.type = TJ_EV_INFER_DONE;
        e.text = tj_get_str(ev, "text");
        e.tokens_out = (uint32_t)tj_get_u64(ev, "tokens_out", 0);
        e.tool_calls = tj_get(ev, "tool_calls");
        if (tj_kind(e.tool_calls) != '[') e.tool_calls = (tj_json){0, 0};
        e.logprobs = tj_get(ev, "logprobs");
        if (tj_kind(e.logprobs) != '[') e.logprobs = (tj_json){0, 0};
        e.confidence = tj_get(ev, "confidence");
        if (tj_kind(e.confidence) != '{') e.confidence = (tj_json){0, 0};
    } else if (tj_eq(e.name, "opened")) {
        e.type = TJ_EV_OPENED;
        e.handle = (uint32_t)tj_get_u64(ev, "handle", 0);
        e.len = tj_get_u64(ev, "len", 0);
        tj_json kind = tj_get(ev, "kind");
        e.kind = kind.ptr ? tj_get_str(kind, "kind") : TJ_STR("text");
        e.format = tj_get_str(kind, "format");
        e.pages = (uint32_t)tj_get_u64(kind, "pages", 0);
        e.has_text_layer = tj_get_bool(kind, "has_text_layer", 0);
    } else if (tj_eq(e.name, "sliced")) {
        e.type = TJ_EV_SLICED;
        e.text = tj_get_str(ev, "text");
        e.next_offset = tj_get_u64(ev, "next_offset", 0);
    } else if (tj_eq(e.name, "sliced_bytes")) {
        e.type = TJ_EV_SLICED_BYTES;
        e.bytes_base64 = tj_get_str(ev, "bytes_base64");
        e.next_offset = tj_get_u64(ev, "next_offset", 0);
    } else if (tj_eq(e.name, "embedded")) {
        e.type = TJ_EV_EMBEDDED;
        e.vectors = tj_get(ev, "vectors");
    } else if (tj_eq(e.name, "emitted")) {
        e.type = TJ_EV_EMITTED;
    } else if (tj_eq(e.name, "page_texted")) {
        e.type = TJ_EV_PAGE_TEXTED;
        e.text = tj_get_str(ev, "text");
    } else if (tj_eq(e.name, "page_text_attempted")) {
        e.type = TJ_EV_PAGE_TEXT_ATTEMPTED;
        e.text = tj_get_str(ev, "text");
        e.error = tj_get_str(ev, "error");
    } else if (tj_eq(e.name, "page_imaged")) {
        e.type = TJ_EV_PAGE_IMAGED;
        e.handle = (uint32_t)tj_get_u64(ev, "handle", 0);
        e.len = tj_get_u64(ev, "len", 0);
    }
    if (!e.text.ptr) e.text = (tj_str){"", 0};
    return e;
}

/* -------------------------------------------------------------- commands -- */

static tj_cmd tj__finish(tj_buf *b) { return (tj_cmd){b->ptr, b->len}; }

static tj_buf tj__cmd_start(const char *tag) {
    tj_buf b = tj_buf_new();
    tj_buf_puts(&b, "{\"cmd\":\"");
    tj_buf_puts(&b, tag);
    tj_buf_putc(&b, '"');
    return b;
}

TJ_API tj_cmd tj_infer_images(tj_str prompt, uint32_t max_tokens, const uint32_t *handles, size_t n) {
    tj_buf b = tj__cmd_start("infer");
    tj_buf_puts(&b, ",\"prompt\":");
    tj_buf_json_str(&b, prompt);
    tj_buf_puts(&b, ",\"max_tokens\":");
    tj_buf_u64(&b, max_tokens);
    tj_buf_puts(&b, ",\"images\":[");
    for (size_t i = 0; i < n; i++) {
        if (i) tj_buf_putc(&b, ',');
        tj_buf_u64(&b, handles[i]);
    }
    tj_buf_puts(&b, "]}");
    return tj__finish(&b);
}
TJ_API tj_cmd tj_infer(tj_str prompt, uint32_t max_tokens) { return tj_infer_images(prompt, max_tokens, 0, 0); }

/* JSON text held in a string (an infer's structured output, a tool call's arguments) as a tj_json. */
TJ_API tj_json tj_parse(tj_str text) {
    tj_str t = tj_trim(text);
    return (tj_json){t.len ? t.ptr : 0, t.len};
}

/* infer with this project's options: the members of the JSON object `options` join the command. */
TJ_API tj_cmd tj_infer_with(tj_str prompt, uint32_t max_tokens, tj_json options) {
    tj_cmd base = tj_infer(prompt, max_tokens);
    tj_str o = tj_trim((tj_str){options.ptr, options.ptr ? options.len : 0});
    if (o.len < 2 || o.ptr[0] != '{' || o.ptr[o.len - 1] != '}') return base;
    tj_str inner = tj_trim((tj_str){o.ptr + 1, o.len - 2});
    if (!inner.len) return base;
    tj_buf b = tj_buf_new();
    tj_buf_put(&b, (tj_str){base.json, base.len - 1}); /* without its closing brace */
    tj_buf_putc(&b, ',');
    tj_buf_put(&b, inner);
    tj_buf_putc(&b, '}');
    return tj__finish(&b);
}

/* infer whose whole answer matches the regular expression `regex` (Rust's regex syntax). */
TJ_API tj_cmd tj_infer_regex(tj_str prompt, uint32_t max_tokens, tj_str regex) {
    return tj_infer_with(prompt, max_tokens, tj_jsonf("{\"regex\":%S}", regex));
}

/* infer whose answer is one of the n strings in `choices`. */
TJ_API tj_cmd tj_infer_choices(tj_str prompt, uint32_t max_tokens, const tj_str *choices, size_t n) {
    tj_buf b = tj_buf_new();
    tj_buf_puts(&b, "{\"choices\":[");
    for (size_t i = 0; i < n; i++) {
        if (i) tj_buf_putc(&b, ',');
        tj_buf_json_str(&b, choices[i]);
    }
    tj_buf_puts(&b, "]}");
    return tj_infer_with(prompt, max_tokens, (tj_json){b.ptr, b.len});
}

/* infer whose answer is a sentence of the Lark grammar `lark` (llguidance's dialect, from its start rule). */
TJ_API tj_cmd tj_infer_grammar(tj_str prompt, uint32_t max_tokens, tj_str lark) {
    return tj_infer_with(prompt, max_tokens, tj_jsonf("{\"grammar\":%S}", lark));
}

TJ_API tj_cmd tj_open(tj_str path) {
    tj_buf b = tj__cmd_start("open");
    tj_buf_puts(&b, ",\"path\":");
    tj_buf_json_str(&b, path);
    tj_buf_putc(&b, '}');
    return tj__finish(&b);
}

static tj_cmd tj__slice(const char *tag, uint32_t handle, uint64_t offset, uint64_t len) {
    tj_buf b = tj__cmd_start(tag);
    tj_buf_puts(&b, ",\"handle\":");
    tj_buf_u64(&b, handle);
    tj_buf_puts(&b, ",\"offset\":");
    tj_buf_u64(&b, offset);
    tj_buf_puts(&b, ",\"len\":");
    tj_buf_u64(&b, len);
    tj_buf_putc(&b, '}');
    return tj__finish(&b);
}
/* A text window; the answer's next_offset (not offset+len) is where to resume. */
TJ_API tj_cmd tj_slice(uint32_t handle, uint64_t offset, uint64_t len) { return tj__slice("slice", handle, offset, len); }
TJ_API tj_cmd tj_slice_bytes(uint32_t handle, uint64_t offset, uint64_t len) {
    return tj__slice("slice_bytes", handle, offset, len);
}

TJ_API tj_cmd tj_embed(const tj_str *texts, size_t n) {
    tj_buf b = tj__cmd_start("embed");
    tj_buf_puts(&b, ",\"texts\":[");
    for (size_t i = 0; i < n; i++) {
        if (i) tj_buf_putc(&b, ',');
        tj_buf_json_str(&b, texts[i]);
    }
    tj_buf_puts(&b, "]}");
    return tj__finish(&b);
}

static tj_cmd tj__page(const char *tag, uint32_t handle, int with_page, uint32_t page) {
    tj_buf b = tj__cmd_start(tag);
    tj_buf_puts(&b, ",\"handle\":");
    tj_buf_u64(&b, handle);
    if (with_page) {
        tj_buf_puts(&b, ",\"page\":");
        tj_buf_u64(&b, page);
    }
    tj_buf_putc(&b, '}');
    return tj__finish(&b);
}
/* The text of one page (from 0); answered by TJ_EV_PAGE_TEXTED. A page
   without text fails the job: use tj_page_text_opt to go on without it. */
TJ_API tj_cmd tj_page_text(uint32_t handle, uint32_t page) { return tj__page("page_text", handle, 1, page); }
/* The text of one page, or an error as data: TJ_EV_PAGE_TEXT_ATTEMPTED. */
TJ_API tj_cmd tj_page_text_opt(uint32_t handle, uint32_t page) { return tj__page("page_text_opt", handle, 1, page); }
/* Render one page to a PNG under a new handle: TJ_EV_PAGE_IMAGED. */
TJ_API tj_cmd tj_page_image(uint32_t handle, uint32_t page) { return tj__page("page_image", handle, 1, page); }
/* Every page's text in one answer, pages separated by a form feed: TJ_EV_PAGE_TEXTED. */
TJ_API tj_cmd tj_document_text(uint32_t handle) { return tj__page("document_text", handle, 0, 0); }

static tj_cmd tj__image_op(uint32_t handle, const char *op, const char *const *names, const uint32_t *values,
                           int n) {
    tj_buf b = tj__cmd_start("image_op");
    tj_buf_puts(&b, ",\"handle\":");
    tj_buf_u64(&b, handle);
    tj_buf_puts(&b, ",\"op\":{\"op\":\"");
    tj_buf_puts(&b, op);
    tj_buf_putc(&b, '"');
    for (int i = 0; i < n; i++) {
        tj_buf_puts(&b, ",\"");
        tj_buf_puts(&b, names[i]);
        tj_buf_puts(&b, "\":");
        tj_buf_u64(&b, values[i]);
    }
    tj_buf_puts(&b, "}}");
    return tj__finish(&b);
}
/* Scale an image to fit max_width x max_height (aspect kept, never enlarged): TJ_EV_PAGE_IMAGED. */
TJ_API tj_cmd tj_image_resize(uint32_t handle, uint32_t max_width, uint32_t max_height) {
    static const char *const names[] = {"max_width", "max_height"};
    uint32_t values[] = {max_width, max_height};
    return tj__image_op(handle, "resize", names, values, 2);
}
/* A region of an image (refused, not clamped, if it reaches outside): TJ_EV_PAGE_IMAGED. */
TJ_API tj_cmd tj_image_crop(uint32_t handle, uint32_t x, uint32_t y, uint32_t width, uint32_t height) {
    static const char *const names[] = {"x", "y", "width", "height"};
    uint32_t values[] = {x, y, width, height};
    return tj__image_op(handle, "crop", names, values, 4);
}
/* Download a URL the job grants (--fetch PREFIX); answered by TJ_EV_OPENED like tj_open. */
TJ_API tj_cmd tj_fetch(tj_str url) {
    tj_buf b = tj__cmd_start("fetch");
    tj_buf_puts(&b, ",\"url\":");
    tj_buf_json_str(&b, url);
    tj_buf_putc(&b, '}');
    return tj__finish(&b);
}

static tj_cmd tj__with_json(const char *tag, const char *field, tj_json v) {
    tj_buf b = tj__cmd_start(tag);
    tj_buf_puts(&b, ",\"");
    tj_buf_puts(&b, field);
    tj_buf_puts(&b, "\":");
    if (v.ptr && v.len) tj_buf_write(&b, v.ptr, v.len);
    else tj_buf_puts(&b, "null");
    tj_buf_putc(&b, '}');
    return tj__finish(&b);
}
/* Forward any JSON to the job's subscribers (answered by TJ_EV_EMITTED). */
TJ_API tj_cmd tj_emit(tj_json progress) { return tj__with_json("emit", "progress", progress); }
/* Emit {"done":done,"total":total}. */
TJ_API tj_cmd tj_progress(uint64_t done, uint64_t total) {
    return tj_emit(tj_jsonf("{\"done\":%llu,\"total\":%llu}", (unsigned long long)done, (unsigned long long)total));
}
/* Finish the job with this result. */
TJ_API tj_cmd tj_done(tj_json result) { return tj__with_json("done", "result", result); }

/* Fail the job with an error code (e.g. "not_found", "unsupported") and message. */
TJ_API tj_cmd tj_fail(const char *code, tj_str message) {
    tj_buf b = tj__cmd_start("fail");
    tj_buf_puts(&b, ",\"code\":");
    tj_buf_json_str(&b, tj_s(code));
    tj_buf_puts(&b, ",\"message\":");
    tj_buf_json_str(&b, message.ptr ? message : TJ_STR(""));
    tj_buf_putc(&b, '}');
    return tj__finish(&b);
}
TJ_API tj_cmd tj_failf(const char *code, const char *fmt, ...) {
    tj_buf m = tj_buf_new();
    va_list ap;
    va_start(ap, fmt);
    tj__vfmt(&m, 0, fmt, ap);
    va_end(ap);
    return tj_fail(code, tj_buf_str(&m));
}

/* ------------------------------------------------------------- streaming -- */

TJ_IMPORT("emit-chunk") int32_t tj__host_emit_chunk(const void *ptr, int32_t len);
TJ_IMPORT("flush") int32_t tj__host_flush(void);
TJ_IMPORT("input-len") int32_t tj__host_input_len(void);
TJ_IMPORT("read-input") int32_t tj__host_read_input(void *ptr, int32_t len);

/* Stream bytes to the job's output (at most 64 KiB a call by default). */
TJ_API int32_t tj_emit_chunk(tj_str bytes) { return tj__host_emit_chunk(bytes.ptr, (int32_t)bytes.len); }
TJ_API int32_t tj_flush(void) { return tj__host_flush(); }
/* Size of the staged input (the job's input_bytes). */
TJ_API uint32_t tj_input_len(void) { return (uint32_t)tj__host_input_len(); }
/* Copy min(n, input_len) bytes from the start of the staged input. */
TJ_API int32_t tj_read_input(void *dst, uint32_t n) { return tj__host_read_input(dst, (int32_t)n); }
/* The whole staged input, in scratch. */
TJ_API tj_str tj_input_bytes(void) {
    uint32_t n = tj_input_len();
    char *p = (char *)tj_alloc((size_t)n + 1);
    int32_t got = n ? tj_read_input(p, n) : 0;
    if (got < 0) got = 0;
    p[got] = 0;
    return (tj_str){p, (size_t)got};
}

/* ------------------------------------------------------------------ ABI -- */

static uint32_t tj__desc[2];

static int32_t tj__answer(tj_cmd c) {
    if (!c.json || !c.len) c = tj_fail("wasm_trap", TJ_STR("the guest returned no command"));
    tj__desc[0] = (uint32_t)(uintptr_t)c.json;
    tj__desc[1] = (uint32_t)c.len;
    return (int32_t)(uintptr_t)tj__desc;
}

TJ_EXPORT("cf_alloc") int32_t cf_alloc(int32_t len) {
    /* The host has read the previous command by now: scratch starts over. */
    tj__arena_reset(&tj__scratch_arena);
    return (int32_t)(uintptr_t)tj_alloc(len > 0 ? (size_t)len : 1);
}

TJ_EXPORT("cf_init") int32_t cf_init(int32_t ptr, int32_t len) {
    return tj__answer(guest_init(tj__trim((const char *)(uintptr_t)ptr, (size_t)len)));
}

TJ_EXPORT("cf_step") int32_t cf_step(int32_t ptr, int32_t len) {
    tj_event ev = tj__parse_event(tj__trim((const char *)(uintptr_t)ptr, (size_t)len));
    return tj__answer(guest_step(ev));
}

#ifdef TJ_ON_TOKEN
TJ_EXPORT("cf_on_token") int32_t cf_on_token(int32_t ptr, int32_t len) {
    return guest_on_token((tj_str){(const char *)(uintptr_t)ptr, (size_t)len});
}
#endif

#if defined(TJ_SIGNATURE_INPUT) && defined(TJ_SIGNATURE_OUTPUT)
/* {"input":"{path: text}","output":"..."}: the block's declared types. */
TJ_EXPORT("cf_signature") int32_t cf_signature(void) {
    tj__arena_reset(&tj__scratch_arena);
    tj_json sig = tj_jsonf("{\"input\":%s,\"output\":%s}", TJ_SIGNATURE_INPUT, TJ_SIGNATURE_OUTPUT);
    tj__desc[0] = (uint32_t)(uintptr_t)sig.ptr;
    tj__desc[1] = (uint32_t)sig.len;
    return (int32_t)(uintptr_t)tj__desc;
}
#endif

#endif /* TENSORJOB_H */
