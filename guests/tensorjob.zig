//! tensorjob.zig -- the Zig SDK for tensor-job guests (cuttlefish proc-block ABI).
//!
//! A guest is a wasm32 module: the host hands it the job input JSON, then one
//! event per step; the guest answers each with a command. This module does the
//! ABI (exports, descriptors, memory) and the JSON (on `std.json`), so a guest
//! is a few plain functions:
//!
//!     const std = @import("std");
//!     const tj = @import("tensorjob");
//!
//!     pub const Input = struct { path: []const u8 };   // or std.json.Value
//!     var path: []const u8 = "";
//!
//!     pub fn init(input: Input) !tj.Command {
//!         path = try tj.keep(input.path);             // outlive this step
//!         return tj.open(path);
//!     }
//!     pub fn step(ev: tj.Event) !tj.Command {
//!         return switch (ev) {
//!             .opened => |o| tj.slice(o.handle, 0, 65536),
//!             .sliced => |s| tj.done(.{ .path = path, .bytes = s.text.len }),
//!             else => tj.fail("unsupported", "unexpected event"),
//!         };
//!     }
//!     // optional: raw UTF-8 token bytes during an infer (may end mid-character)
//!     pub fn onToken(token: []const u8) tj.TokenAction {
//!         return if (std.mem.indexOfScalar(u8, token, '.') != null) .stop else .@"continue";
//!     }
//!
//!     comptime { tj.exportGuest(@This()); }
//!
//! Compile: `zig build-exe guest.zig -target wasm32-freestanding -fno-entry
//! -rdynamic -O ReleaseSmall --dep tensorjob -Mroot=guest.zig
//! -Mtensorjob=tensorjob.zig` (tensorjob_jupyter.compile does this).
//!
//! `init` takes the input parsed into any type (a struct with defaults for
//! optional keys; unknown keys are ignored; bad input fails the job with
//! `schema_validation_failed`), a `std.json.Value`, or the raw `[]const u8`.
//! `init`/`step` return `Command` or `!Command`; an error fails the job with
//! `wasm_trap` and the error's name.
//!
//! Events (`tj.Event`, a tagged union): `.infer_done{text, tokens_out, tool_calls}`
//! (`tool_calls`: `[]const tj.ToolCall{call_id, name, arguments}`, empty unless the
//! model called a tool; `arguments` is JSON text),
//! `.opened{handle, len, kind}` (`kind.is("text")`, `.kind.format`, and for
//! a document `.kind.pages`, `.kind.has_text_layer`),
//! `.sliced{text, next_offset}`, `.sliced_bytes` (`.bytes()` decodes),
//! `.embedded{vectors}`, `.emitted`, `.page_texted{text}`,
//! `.page_text_attempted{text, err}` (one of the two is null),
//! `.page_imaged{handle, len}` (a new PNG handle), `.unknown` (the tag of
//! anything newer).
//! Commands (`tj.Command`): `infer(prompt, max_tokens)`, `inferImages`,
//! `inferWith(prompt, max_tokens, tj.InferOptions{...})` (this project's extension:
//! `.format = tj.json(.{ .type = "json_schema", .name = "facts", .schema = ... })`,
//! `.tools`, `.tool_choice`, and sampling `.temperature`, `.top_p`, `.top_k`, `.min_p`,
//! `.repeat_penalty`, `.seed`, `.stop`; the answer held to a shape: `.regex = "[0-9]+"`
//! (the whole answer matches), `.choices = &.{ "yes", "no" }` (it is one of them),
//! `.grammar = "start: ..."` (a sentence of the Lark grammar); `.logprobs = true` and
//! `.top_logprobs = N` ask for each token's logprob in `.infer_done.logprobs` and each JSON
//! field's confidence, `e.fieldConfidence("facts.year")`; fields left null are not sent),
//! `open(path)`, `slice(handle, offset, len)` (resume from `next_offset`),
//! `sliceBytes`, `embed(texts)`, `emit(value)`, `progress(done, total)`,
//! `done(value)`, `fail(code, message)`, `failf(code, fmt, args)`; `emit` and
//! `done` stringify any value now (structs, slices, `std.json.Value`, `tj.Json`).
//! Documents (pages count from 0): `pageText(handle, page)` (a page without
//! text fails the job), `pageTextOpt(handle, page)` (answers `.page_text_attempted`
//! and the job goes on), `documentText(handle)` (pages separated by '\x0c'),
//! `pageImage(handle, page)`, `imageResize(handle, max_width, max_height)` (fit,
//! keep the aspect, never enlarge), `imageCrop(handle, x, y, width, height)`
//! (refused outside the image, not clamped) -- the last three answer
//! `.page_imaged` with a new PNG handle -- and `fetch(url)`, answered by
//! `.opened` like `open` (the job must grant the URL with `--fetch PREFIX`).
//! Strings are escaped exactly; invalid UTF-8 becomes U+FFFD.
//! Helpers: `tj.print(fmt, args)`, `tj.json(value)`, `tj.keep(bytes)`,
//! `tj.scratch()`, `tj.persistent`. Streaming (imported only if called):
//! `emitChunk(bytes)` -> 0 | `stream_disabled` | `stream_rejected` |
//! `stream_closed`, `flush()`, `inputLen()`, `readInput(buf)`, `inputBytes()`.
//!
//! Memory stays flat: everything the SDK makes for one call (the input or
//! event, parsed values, the command) lives in a scratch arena that is reset
//! each time the host calls `cf_alloc`, i.e. before every cf_init, cf_step and
//! cf_on_token. RULE: what you need in a later step must be copied out of the
//! event (`tj.keep(bytes)`, or `tj.persistent` for your own allocations).
//! Running out of memory (the host's limit) traps.

const std = @import("std");

pub const sdk_version = "0.1.0";

// ------------------------------------------------------------------- memory

/// The scratch arena: a chain of chunks carved from linear memory with
/// `memory.grow`. Resetting rewinds to the first chunk and the chain is reused
/// from the start, so a job whose steps look alike (one window each) reaches
/// its peak memory in the first step and stays there. (std's ArenaAllocator
/// with `.retain_capacity` reallocates one merged buffer on every reset, and
/// the power-of-two page classes of wasm_allocator make its peak wander.)
const Scratch = struct {
    const Chunk = struct { next: ?*Chunk, size: usize, used: usize };
    const page = 64 * 1024;
    const min_chunk = 64 * 1024;

    head: ?*Chunk = null,
    cur: ?*Chunk = null,

    fn data(c: *Chunk) usize {
        return @intFromPtr(c) + @sizeOf(Chunk);
    }

    fn newChunk(need: usize) ?*Chunk {
        const want = @max(need +| (@sizeOf(Chunk) + 16), min_chunk);
        const pages = std.math.divCeil(usize, want, page) catch return null;
        const first = @wasmMemoryGrow(0, pages);
        if (first < 0) return null;
        const c: *Chunk = @ptrFromInt(@as(usize, @intCast(first)) * page);
        c.* = .{ .next = null, .size = pages * page - @sizeOf(Chunk), .used = 0 };
        return c;
    }

    fn reset(self: *Scratch) void {
        if (self.head) |h| {
            h.used = 0;
            self.cur = h;
        }
    }

    fn alloc(ctx: *anyopaque, len: usize, alignment: std.mem.Alignment, _: usize) ?[*]u8 {
        const self: *Scratch = @ptrCast(@alignCast(ctx));
        if (self.cur == null) {
            self.head = newChunk(len + alignment.toByteUnits()) orelse return null;
            self.cur = self.head;
        }
        while (true) {
            const c = self.cur.?;
            const start = alignment.forward(data(c) + c.used);
            if (start + len <= data(c) + c.size) {
                c.used = start + len - data(c);
                return @ptrFromInt(start);
            }
            if (c.next == null) c.next = newChunk(len + alignment.toByteUnits()) orelse return null;
            self.cur = c.next;
            self.cur.?.used = 0; // chunks past `cur` hold nothing live
        }
    }

    /// Only the most recent allocation can change size (in place).
    fn resize(ctx: *anyopaque, buf: []u8, _: std.mem.Alignment, new_len: usize, _: usize) bool {
        const self: *Scratch = @ptrCast(@alignCast(ctx));
        const c = self.cur orelse return false;
        const start = @intFromPtr(buf.ptr);
        if (start + buf.len != data(c) + c.used) return new_len <= buf.len;
        if (start + new_len > data(c) + c.size) return false;
        c.used = start + new_len - data(c);
        return true;
    }

    fn remap(ctx: *anyopaque, buf: []u8, alignment: std.mem.Alignment, new_len: usize, ra: usize) ?[*]u8 {
        return if (resize(ctx, buf, alignment, new_len, ra)) buf.ptr else null;
    }

    fn free(ctx: *anyopaque, buf: []u8, _: std.mem.Alignment, _: usize) void {
        const self: *Scratch = @ptrCast(@alignCast(ctx));
        const c = self.cur orelse return;
        if (@intFromPtr(buf.ptr) + buf.len == data(c) + c.used) c.used = @intFromPtr(buf.ptr) - data(c);
    }

    const vtable: std.mem.Allocator.VTable = .{ .alloc = alloc, .resize = resize, .remap = remap, .free = free };
};

var scratch_state: Scratch = .{};

/// Per-call memory: valid until the host's next `cf_alloc` (the next step).
pub fn scratch() std.mem.Allocator {
    return .{ .ptr = &scratch_state, .vtable = &Scratch.vtable };
}

/// Memory for the rest of the job (free it yourself if you like).
pub const persistent: std.mem.Allocator = std.heap.wasm_allocator;

fn oom() noreturn {
    @trap(); // the host's memory limit: the job ends with wasm_trap
}

/// Copy bytes into persistent memory, so they outlive the current step.
pub fn keep(bytes: []const u8) error{OutOfMemory}![]u8 {
    return persistent.dupe(u8, bytes);
}

/// `std.fmt` into scratch memory.
pub fn print(comptime fmt: []const u8, args: anytype) []u8 {
    return std.fmt.allocPrint(scratch(), fmt, args) catch oom();
}

// -------------------------------------------------------------------- events

/// What `opened` says a handle holds: `kind` is "text", "binary", "image"
/// (with `format`) or "document" (with `pages` and `has_text_layer`).
pub const Kind = struct {
    kind: []const u8 = "text",
    format: ?[]const u8 = null,
    pages: ?u32 = null,
    has_text_layer: ?bool = null,

    pub fn is(self: Kind, name: []const u8) bool {
        return std.mem.eql(u8, self.kind, name);
    }
};

/// One event from the host, as a tagged union. Strings point into scratch.
pub const Event = union(enum) {
    infer_done: InferDone,
    opened: struct { handle: u32, len: u64, kind: Kind },
    /// A text window; resume from `next_offset` (windows end on a UTF-8 boundary).
    sliced: struct { text: []const u8, next_offset: u64 },
    sliced_bytes: SlicedBytes,
    embedded: struct { vectors: []const []const f32 },
    emitted,
    /// The text of a page (`page_text`) or of every page (`document_text`).
    page_texted: struct { text: []const u8 },
    /// The answer to `page_text_opt`: the page's text, or why it could not be read.
    page_text_attempted: struct { text: ?[]const u8, err: ?[]const u8 },
    /// A new handle holding a PNG (`page_image`, `image_op`), and its size.
    page_imaged: struct { handle: u32, len: u64 },
    /// An event this SDK does not know; the name is its "event" tag.
    unknown: []const u8,

    pub const SlicedBytes = struct {
        bytes_base64: []const u8,
        next_offset: u64,

        /// The window's bytes, decoded into scratch.
        pub fn bytes(self: SlicedBytes) []u8 {
            const dec = std.base64.standard.Decoder;
            const n = dec.calcSizeForSlice(self.bytes_base64) catch return &.{};
            const out = scratch().alloc(u8, n) catch oom();
            dec.decode(out, self.bytes_base64) catch return &.{};
            return out;
        }
    };
};

/// The model's answer to an `infer`. `logprobs` (one record per generated token) and `confidence` (each
/// field of a JSON answer, by dotted path) are there when the infer asked (`.logprobs = true`) and the
/// model gave them; empty and null otherwise (docs/guests.md, "Confidence").
pub const InferDone = struct {
    text: []const u8,
    tokens_out: u32,
    tool_calls: []const ToolCall = &.{},
    logprobs: []const TokenLogprob = &.{},
    confidence: ?std.json.ArrayHashMap(?f64) = null,

    /// A field's confidence, 0..1 (`""` is the whole answer): null when the model gave no logprobs or the
    /// tokens do not spell that field.
    pub fn fieldConfidence(self: InferDone, field: []const u8) ?f64 {
        const map = self.confidence orelse return null;
        return map.map.get(field) orelse null;
    }
};

/// One generated token: its logprob (after the grammar's mask), the best other token's, and the top
/// alternatives when the infer asked for `top_logprobs`.
pub const TokenLogprob = struct {
    token: []const u8 = "",
    logprob: f64 = 0,
    runner_up_logprob: ?f64 = null,
    top_logprobs: []const TopLogprob = &.{},
};
pub const TopLogprob = struct { token: []const u8 = "", logprob: f64 = 0 };

/// A tool call the model made (`infer` with `tools`); `arguments` is JSON text.
pub const ToolCall = struct { call_id: []const u8 = "", name: []const u8 = "", arguments: []const u8 = "{}" };

/// The wire shape of every event at once; `parseEvent` narrows it.
const WireEvent = struct {
    event: []const u8,
    tool_calls: []const ToolCall = &.{},
    logprobs: ?[]const TokenLogprob = null,
    confidence: ?std.json.ArrayHashMap(?f64) = null,
    text: ?[]const u8 = null,
    @"error": ?[]const u8 = null,
    tokens_out: u32 = 0,
    handle: u32 = 0,
    len: u64 = 0,
    kind: Kind = .{},
    next_offset: u64 = 0,
    bytes_base64: []const u8 = "",
    vectors: []const []const f32 = &.{},
};

const parse_options: std.json.ParseOptions = .{ .ignore_unknown_fields = true, .duplicate_field_behavior = .use_last };

/// Parse one event JSON (into scratch).
pub fn parseEvent(bytes: []const u8) !Event {
    const w = try std.json.parseFromSliceLeaky(WireEvent, scratch(), bytes, parse_options);
    const eq = std.mem.eql;
    const text = w.text orelse "";
    if (eq(u8, w.event, "infer_done"))
        return .{ .infer_done = .{ .text = text, .tokens_out = w.tokens_out, .tool_calls = w.tool_calls,
                                   .logprobs = w.logprobs orelse &.{}, .confidence = w.confidence } };
    if (eq(u8, w.event, "opened")) return .{ .opened = .{ .handle = w.handle, .len = w.len, .kind = w.kind } };
    if (eq(u8, w.event, "sliced")) return .{ .sliced = .{ .text = text, .next_offset = w.next_offset } };
    if (eq(u8, w.event, "page_texted")) return .{ .page_texted = .{ .text = text } };
    if (eq(u8, w.event, "page_text_attempted")) return .{ .page_text_attempted = .{ .text = w.text, .err = w.@"error" } };
    if (eq(u8, w.event, "page_imaged")) return .{ .page_imaged = .{ .handle = w.handle, .len = w.len } };
    if (eq(u8, w.event, "sliced_bytes"))
        return .{ .sliced_bytes = .{ .bytes_base64 = w.bytes_base64, .next_offset = w.next_offset } };
    if (eq(u8, w.event, "embedded")) return .{ .embedded = .{ .vectors = w.vectors } };
    if (eq(u8, w.event, "emitted")) return .emitted;
    return .{ .unknown = w.event };
}

// ------------------------------------------------------------------ commands

/// A piece of JSON text, written verbatim (the payload of `emit` and `done`).
pub const Json = struct {
    raw: []const u8,

    pub fn jsonStringify(self: Json, jw: anytype) !void {
        try jw.print("{s}", .{if (self.raw.len == 0) "null" else self.raw});
    }
};

/// Stringify any value (struct, slice, number, `std.json.Value`, ...) into scratch.
pub fn json(value: anytype) Json {
    if (@TypeOf(value) == Json) return value;
    var out: std.Io.Writer.Allocating = .init(scratch());
    var jw: std.json.Stringify = .{ .writer = &out.writer };
    writeValue(&jw, value) catch oom();
    return .{ .raw = out.written() };
}

pub const Infer = struct {
    prompt: []const u8,
    max_tokens: u32,
    images: []const u32 = &.{},
    // this project's extension; a null field is not written, so `infer` stays cuttlefish's bytes
    format: ?Json = null,
    tools: ?Json = null,
    tool_choice: ?Json = null,
    temperature: ?f64 = null,
    top_p: ?f64 = null,
    top_k: ?u32 = null,
    min_p: ?f64 = null,
    repeat_penalty: ?f64 = null,
    seed: ?u32 = null,
    stop: ?[]const []const u8 = null,
    regex: ?[]const u8 = null,
    choices: ?[]const []const u8 = null,
    grammar: ?[]const u8 = null,
    logprobs: ?bool = null,
    top_logprobs: ?u32 = null,
};

/// `infer`'s optional fields (see `inferWith`).
pub const InferOptions = struct {
    format: ?Json = null,
    tools: ?Json = null,
    tool_choice: ?Json = null,
    temperature: ?f64 = null,
    top_p: ?f64 = null,
    top_k: ?u32 = null,
    min_p: ?f64 = null,
    repeat_penalty: ?f64 = null,
    seed: ?u32 = null,
    stop: ?[]const []const u8 = null,
    regex: ?[]const u8 = null,
    choices: ?[]const []const u8 = null,
    grammar: ?[]const u8 = null,
    /// Each token's logprob and each field's confidence in `infer_done`; `top_logprobs` (0..20) alternatives.
    logprobs: ?bool = null,
    top_logprobs: ?u32 = null,
};
pub const Open = struct { path: []const u8 };
pub const Slice = struct { handle: u32, offset: u64, len: u64 };
pub const Embed = struct { texts: []const []const u8 };
pub const Emit = struct { progress: Json };
pub const Done = struct { result: Json };
pub const Fail = struct { code: []const u8, message: []const u8 };
pub const Page = struct { handle: u32, page: u32 };
pub const DocumentText = struct { handle: u32 };
pub const ImageOp = struct { handle: u32, op: ImageOperation };
pub const Fetch = struct { url: []const u8 };

/// What `image_op` does; serialised with its `"op"` tag first, as cuttlefish's serde does.
pub const ImageOperation = union(enum) {
    resize: struct { max_width: u32, max_height: u32 },
    crop: struct { x: u32, y: u32, width: u32, height: u32 },

    pub fn jsonStringify(self: ImageOperation, jw: anytype) !void {
        try jw.beginObject();
        try jw.objectField("op");
        try jw.write(@tagName(self));
        switch (self) {
            inline else => |payload| {
                inline for (@typeInfo(@TypeOf(payload)).@"struct".field_names) |name| {
                    try jw.objectField(name);
                    try jw.write(@field(payload, name));
                }
            },
        }
        try jw.endObject();
    }
};

/// What a guest asks the host to do. Serialises as cuttlefish's serde does:
/// `{"cmd":"<tag>", <fields in declaration order>}`.
pub const Command = union(enum) {
    infer: Infer,
    open: Open,
    slice: Slice,
    slice_bytes: Slice,
    embed: Embed,
    emit: Emit,
    done: Done,
    fail: Fail,
    page_text: Page,
    page_text_opt: Page,
    page_image: Page,
    document_text: DocumentText,
    image_op: ImageOp,
    fetch: Fetch,

    pub fn jsonStringify(self: Command, jw: anytype) !void {
        try jw.beginObject();
        try jw.objectField("cmd");
        try jw.write(@tagName(self));
        switch (self) {
            inline else => |payload| {
                const info = @typeInfo(@TypeOf(payload)).@"struct";
                inline for (info.field_names, info.field_types) |name, FT| {
                    // optional fields (infer's extension) are written only when set
                    const skip = @typeInfo(FT) == .optional and @field(payload, name) == null;
                    if (!skip) {
                        try jw.objectField(name);
                        try writeValue(jw, @field(payload, name));
                    }
                }
            },
        }
        try jw.endObject();
    }

    /// The command's JSON, in scratch.
    pub fn toJson(self: Command) []const u8 {
        return json(self).raw;
    }
};

/// Like `Stringify.write`, but byte strings are always JSON strings, however
/// deep they sit in structs, optionals, slices and arrays: invalid UTF-8
/// becomes U+FFFD (std.json would write an array of numbers instead).
fn writeValue(jw: *std.json.Stringify, value: anytype) std.json.Stringify.Error!void {
    const T = @TypeOf(value);
    if (comptime isByteString(T)) {
        const s: []const u8 = value;
        return jw.write(if (std.unicode.utf8ValidateSlice(s)) s else sanitize(s));
    }
    switch (@typeInfo(T)) {
        .optional => return if (value) |v| writeValue(jw, v) else jw.write(null),
        .@"struct" => |S| if (!std.meta.hasFn(T, "jsonStringify")) {
            if (S.is_tuple) try jw.beginArray() else try jw.beginObject();
            inline for (S.field_names, S.field_types) |name, FT| {
                if (FT != void) {
                    if (!S.is_tuple) try jw.objectField(name);
                    try writeValue(jw, @field(value, name));
                }
            }
            return if (S.is_tuple) jw.endArray() else jw.endObject();
        },
        .pointer => |p| switch (p.size) {
            .slice => {
                try jw.beginArray();
                for (value) |item| try writeValue(jw, item);
                return jw.endArray();
            },
            .one => if (@typeInfo(p.child) != .array and @typeInfo(p.child) != .@"opaque" and
                @typeInfo(p.child) != .@"fn") return writeValue(jw, value.*),
            else => {},
        },
        .array => return writeValue(jw, &value),
        else => {},
    }
    return jw.write(value);
}

fn isByteString(comptime T: type) bool {
    return switch (@typeInfo(T)) {
        .pointer => |p| switch (p.size) {
            .slice => p.child == u8,
            .one => switch (@typeInfo(p.child)) {
                .array => |a| a.child == u8,
                else => false,
            },
            else => false,
        },
        else => false,
    };
}

/// A copy of `s` with each invalid UTF-8 sequence replaced by U+FFFD.
fn sanitize(s: []const u8) []const u8 {
    var out: std.ArrayList(u8) = .empty;
    var i: usize = 0;
    while (i < s.len) {
        const n = std.unicode.utf8ByteSequenceLength(s[i]) catch 0;
        if (n != 0 and i + n <= s.len) {
            if (std.unicode.utf8Decode(s[i..][0..n])) |_| {
                out.appendSlice(scratch(), s[i..][0..n]) catch oom();
                i += n;
                continue;
            } else |_| {}
        }
        out.appendSlice(scratch(), "\u{FFFD}") catch oom();
        i += 1;
    }
    return out.items;
}

// The builders copy their strings and slices into scratch, so a command may
// be built from a stack buffer or an array literal (`tj.embed(&.{ a, b })`)
// that dies when `init`/`step` returns; the host reads the command after that.

fn copy(bytes: []const u8) []const u8 {
    return scratch().dupe(u8, bytes) catch oom();
}

fn copyAll(strings: []const []const u8) []const []const u8 {
    const list = scratch().alloc([]const u8, strings.len) catch oom();
    for (strings, list) |t, *slot| slot.* = copy(t);
    return list;
}

/// Run `prompt` through the model, generating at most `max_tokens`.
pub fn infer(prompt: []const u8, max_tokens: u32) Command {
    return .{ .infer = .{ .prompt = copy(prompt), .max_tokens = max_tokens } };
}
/// The same, with image handles (from `opened`) for a vision model.
pub fn inferImages(prompt: []const u8, max_tokens: u32, images: []const u32) Command {
    const handles = scratch().dupe(u32, images) catch oom();
    return .{ .infer = .{ .prompt = copy(prompt), .max_tokens = max_tokens, .images = handles } };
}
/// `infer` with this project's options: structured output (`format`, `regex`, `choices`, `grammar`), `tools`,
/// sampling.
pub fn inferWith(prompt: []const u8, max_tokens: u32, options: InferOptions) Command {
    var cmd: Infer = .{ .prompt = copy(prompt), .max_tokens = max_tokens };
    inline for (@typeInfo(InferOptions).@"struct".field_names) |name| @field(cmd, name) = @field(options, name);
    if (options.stop) |stops| cmd.stop = copyAll(stops);
    if (options.choices) |choices| cmd.choices = copyAll(choices);
    if (options.regex) |regex| cmd.regex = copy(regex);
    if (options.grammar) |lark| cmd.grammar = copy(lark);
    return .{ .infer = cmd };
}
/// Open a file the job may read; answered by `.opened`.
pub fn open(path: []const u8) Command {
    return .{ .open = .{ .path = copy(path) } };
}
/// A text window; answered by `.sliced` (resume from its `next_offset`).
pub fn slice(handle: u32, offset: u64, len: u64) Command {
    return .{ .slice = .{ .handle = handle, .offset = offset, .len = len } };
}
/// A binary window; answered by `.sliced_bytes`.
pub fn sliceBytes(handle: u32, offset: u64, len: u64) Command {
    return .{ .slice_bytes = .{ .handle = handle, .offset = offset, .len = len } };
}
/// Embed texts; answered by `.embedded` (one vector per text, same order).
pub fn embed(texts: []const []const u8) Command {
    const list = scratch().alloc([]const u8, texts.len) catch oom();
    for (texts, list) |t, *slot| slot.* = copy(t);
    return .{ .embed = .{ .texts = list } };
}
/// Forward any value (stringified now) to the job's subscribers.
pub fn emit(value: anytype) Command {
    return .{ .emit = .{ .progress = json(value) } };
}
/// Emit `{"done":done,"total":total}`.
pub fn progress(done_count: u64, total: u64) Command {
    return emit(.{ .done = done_count, .total = total });
}
/// Finish the job with this result (any value, stringified now).
pub fn done(value: anytype) Command {
    return .{ .done = .{ .result = json(value) } };
}
/// Fail the job with an error code (e.g. "not_found", "unsupported").
pub fn fail(code: []const u8, message: []const u8) Command {
    return .{ .fail = .{ .code = copy(code), .message = copy(message) } };
}
/// `fail` with a formatted message.
pub fn failf(code: []const u8, comptime fmt: []const u8, args: anytype) Command {
    return fail(code, print(fmt, args));
}
/// The text of one page (from 0); answered by `.page_texted`. A page without
/// text fails the job: `pageTextOpt` goes on without it.
pub fn pageText(handle: u32, page: u32) Command {
    return .{ .page_text = .{ .handle = handle, .page = page } };
}
/// The text of one page or an error, as data: `.page_text_attempted`.
pub fn pageTextOpt(handle: u32, page: u32) Command {
    return .{ .page_text_opt = .{ .handle = handle, .page = page } };
}
/// Render one page to a PNG under a new handle: `.page_imaged`.
pub fn pageImage(handle: u32, page: u32) Command {
    return .{ .page_image = .{ .handle = handle, .page = page } };
}
/// Every page's text, separated by form feeds: `.page_texted`.
pub fn documentText(handle: u32) Command {
    return .{ .document_text = .{ .handle = handle } };
}
/// Scale an image to fit the bounds (aspect kept, never enlarged): `.page_imaged`.
pub fn imageResize(handle: u32, max_width: u32, max_height: u32) Command {
    return .{ .image_op = .{ .handle = handle, .op = .{ .resize = .{ .max_width = max_width, .max_height = max_height } } } };
}
/// A region of an image (refused if it reaches outside, not clamped): `.page_imaged`.
pub fn imageCrop(handle: u32, x: u32, y: u32, width: u32, height: u32) Command {
    return .{ .image_op = .{ .handle = handle, .op = .{ .crop = .{ .x = x, .y = y, .width = width, .height = height } } } };
}
/// Download a URL the job grants; answered by `.opened`, exactly like `open`.
pub fn fetch(url: []const u8) Command {
    return .{ .fetch = .{ .url = copy(url) } };
}

// ----------------------------------------------------------------- streaming

/// `emit-chunk` results: 0 ok; the rest are errors.
pub const stream_disabled: i32 = -1;
pub const stream_rejected: i32 = -2;
pub const stream_closed: i32 = -3;

const host = struct {
    extern "wasi:tensor/host@0.1.0" fn @"emit-chunk"(ptr: [*]const u8, len: usize) i32;
    extern "wasi:tensor/host@0.1.0" fn flush() i32;
    extern "wasi:tensor/host@0.1.0" fn @"input-len"() i32;
    extern "wasi:tensor/host@0.1.0" fn @"read-input"(ptr: [*]u8, len: usize) i32;
};

/// Stream bytes to the job's output (the host caps each chunk, 64 KiB by default).
/// Returns 0, `stream_disabled`, `stream_rejected` or `stream_closed`.
/// Only a guest that calls these imports the host functions.
pub fn emitChunk(bytes: []const u8) i32 {
    return host.@"emit-chunk"(bytes.ptr, bytes.len);
}
pub fn flush() i32 {
    return host.flush();
}
/// Size of the job's staged input bytes.
pub fn inputLen() u32 {
    return @bitCast(host.@"input-len"());
}
/// Copy the start of the staged input into `buf`; returns the count or -2.
pub fn readInput(buf: []u8) i32 {
    return host.@"read-input"(buf.ptr, buf.len);
}
/// All staged input, in scratch.
pub fn inputBytes() []u8 {
    const buf = scratch().alloc(u8, inputLen()) catch oom();
    const n = readInput(buf);
    return buf[0..@intCast(@max(n, 0))];
}

// ------------------------------------------------------------------------ ABI

pub const TokenAction = enum(i32) { @"continue" = 0, stop = 1 };

var desc: [2]u32 = .{ 0, 0 };

fn answer(cmd: Command) u32 {
    const text = cmd.toJson();
    desc = .{ @intFromPtr(text.ptr), @intCast(text.len) };
    return @intFromPtr(&desc);
}

fn unwrap(result: anytype, comptime what: []const u8) Command {
    if (@typeInfo(@TypeOf(result)) == .error_union) {
        return result catch |err| failf("wasm_trap", "guest error in " ++ what ++ ": {s}", .{@errorName(err)});
    }
    return result;
}

fn bytesAt(ptr: u32, len: u32) []const u8 {
    if (len == 0) return "";
    return @as([*]const u8, @ptrFromInt(ptr))[0..len];
}

/// Export `cf_alloc`, `cf_init`, `cf_step` (and `cf_on_token` when the guest
/// has `onToken`) wired to the guest's `init`, `step` and `onToken`.
/// Call once from the guest: `comptime { tj.exportGuest(@This()); }`.
pub fn exportGuest(comptime Guest: type) void {
    if (!@hasDecl(Guest, "init")) @compileError("a tensorjob guest needs `pub fn init(input) !tj.Command`");
    if (!@hasDecl(Guest, "step")) @compileError("a tensorjob guest needs `pub fn step(ev: tj.Event) !tj.Command`");
    const Glue = struct {
        fn cfAlloc(len: u32) callconv(.c) u32 {
            // The host has read the previous command: scratch starts over.
            scratch_state.reset();
            const mem = scratch().alloc(u8, @max(len, 1)) catch oom();
            return @intFromPtr(mem.ptr);
        }

        fn cfInit(ptr: u32, len: u32) callconv(.c) u32 {
            const raw = bytesAt(ptr, len);
            const Input = @typeInfo(@TypeOf(Guest.init)).@"fn".param_types[0] orelse
                @compileError("`init` must take a concrete input type");
            const input: Input = if (Input == []const u8)
                raw
            else
                std.json.parseFromSliceLeaky(Input, scratch(), raw, parse_options) catch |err|
                    return answer(failf("schema_validation_failed", "the job input does not fit {s}: {s}", .{
                        @typeName(Input), @errorName(err),
                    }));
            return answer(unwrap(Guest.init(input), "init"));
        }

        fn cfStep(ptr: u32, len: u32) callconv(.c) u32 {
            const ev = parseEvent(bytesAt(ptr, len)) catch |err|
                return answer(failf("wasm_trap", "the guest could not parse an event: {s}", .{@errorName(err)}));
            return answer(unwrap(Guest.step(ev), "step"));
        }

        fn cfOnToken(ptr: u32, len: u32) callconv(.c) i32 {
            const verdict = Guest.onToken(bytesAt(ptr, len));
            return switch (@TypeOf(verdict)) {
                TokenAction => @intFromEnum(verdict),
                bool => @intFromBool(verdict), // true = stop
                else => @compileError("onToken must return tj.TokenAction"),
            };
        }
    };
    @export(&Glue.cfAlloc, .{ .name = "cf_alloc" });
    @export(&Glue.cfInit, .{ .name = "cf_init" });
    @export(&Glue.cfStep, .{ .name = "cf_step" });
    if (@hasDecl(Guest, "onToken")) @export(&Glue.cfOnToken, .{ .name = "cf_on_token" });
}
