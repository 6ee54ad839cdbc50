//! wordcount.zig -- the word counter of wordcount.c, on the Zig SDK.
//!
//! Input:  {"path": "notes.txt", "window": 65536}   (window optional)
//! Result: {"path": ..., "words": N, "bytes": M}
//!
//! Walks the file in `slice` windows, resuming from the host's `next_offset`,
//! and carries only counters from one window to the next, so its memory is
//! the same whatever the file's size. Words are runs of non-whitespace, as
//! Python's str.split() sees them for ASCII whitespace.
const std = @import("std");
const tj = @import("tensorjob");

pub const Input = struct {
    path: []const u8,
    window: u64 = 64 * 1024,
};

var path: []const u8 = "";
var window: u64 = 64 * 1024;
var handle: u32 = 0;
var file_len: u64 = 0;
var offset: u64 = 0;
var words: u64 = 0;
var bytes: u64 = 0;
var windows: u64 = 0;
var in_word = false;

fn isSpace(c: u8) bool {
    return c == ' ' or (c >= '\t' and c <= '\r') or (c >= 0x1c and c <= 0x1f);
}

fn finish() tj.Command {
    return tj.done(.{ .path = path, .words = words, .bytes = bytes });
}

pub fn init(input: Input) !tj.Command {
    path = try tj.keep(input.path); // the input lives in scratch: keep what we need
    window = if (input.window == 0) 64 * 1024 else input.window;
    return tj.open(path);
}

pub fn step(ev: tj.Event) !tj.Command {
    switch (ev) {
        .opened => |o| {
            if (!o.kind.is("text")) return tj.failf("unsupported", "{s} is not text", .{path});
            handle = o.handle;
            file_len = o.len;
            if (file_len == 0) return finish();
            return tj.slice(handle, 0, window);
        },
        .sliced => |s| {
            for (s.text) |c| {
                const space = isSpace(c);
                if (!space and !in_word) words += 1;
                in_word = !space;
            }
            bytes += s.text.len;
            windows += 1;
            if (s.text.len == 0 and s.next_offset <= offset and s.next_offset < file_len)
                return tj.failf("wasm_trap", "no progress at offset {d}", .{offset});
            offset = s.next_offset;
            if (offset >= file_len) return finish();
            // Progress after the first window, then every 16th: a small event stream.
            if (windows % 16 == 1) return tj.progress(offset, file_len);
            return tj.slice(handle, offset, window);
        },
        .emitted => return tj.slice(handle, offset, window),
        else => return tj.fail("unsupported", "unexpected event"),
    }
}

comptime {
    tj.exportGuest(@This());
}
