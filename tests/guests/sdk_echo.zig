//! sdk_echo.zig -- exercises the Zig SDK for tests/sandbox/test_sdk_zig.py.
//!
//! init: the input's "cmd" picks the answer: "echo" (default) returns the
//! input's "s" with its bytes in hex; other values return one command from the
//! matching SDK builder. step: emits a description of the parsed event, plus
//! the string kept from the input and the tokens seen by onToken.
const std = @import("std");
const tj = @import("tensorjob");

var kept: []const u8 = "";
var tokens: u64 = 0;

fn eql(a: []const u8, b: []const u8) bool {
    return std.mem.eql(u8, a, b);
}

fn str(v: ?std.json.Value) ?[]const u8 {
    const value = v orelse return null;
    return switch (value) {
        .string => |s| s,
        else => null,
    };
}

fn hex(bytes: []const u8) []const u8 {
    const digits = "0123456789abcdef";
    const out = tj.scratch().alloc(u8, bytes.len * 2) catch @trap();
    for (bytes, 0..) |b, i| {
        out[2 * i] = digits[b >> 4];
        out[2 * i + 1] = digits[b & 15];
    }
    return out;
}

pub fn init(input: std.json.Value) !tj.Command {
    const obj = switch (input) {
        .object => |o| o,
        else => return tj.fail("schema_validation_failed", "the input must be an object"),
    };
    const cmd = str(obj.get("cmd")) orelse "echo";
    const s = str(obj.get("s"));
    const text = s orelse "";
    kept = try tj.keep(text);
    if (eql(cmd, "echo")) return tj.done(.{
        .s = s,
        .hex = hex(text),
        .len = text.len,
        .nested = obj.get("nested"),
        .missing = obj.get("nope"),
    });
    if (eql(cmd, "infer")) return tj.infer(text, 32);
    if (eql(cmd, "infer_with")) return tj.inferWith(text, 16, .{
        .format = tj.json(.{ .type = "text" }),
        .tool_choice = tj.json("none"),
        .temperature = 0.5,
        .seed = 3,
        .stop = &.{ "x", "y" },
    });
    if (eql(cmd, "infer_images")) return tj.inferImages(text, 0, &.{ 1, 4294967295 });
    if (eql(cmd, "open")) return tj.open(text);
    if (eql(cmd, "slice")) return tj.slice(7, 4294967296, 65536);
    if (eql(cmd, "slice_bytes")) return tj.sliceBytes(0, 0, std.math.maxInt(u64));
    if (eql(cmd, "embed")) return tj.embed(&.{ text, "b", "" });
    if (eql(cmd, "emit")) return tj.emit(obj.get("payload"));
    if (eql(cmd, "progress")) return tj.progress(3, 10);
    if (eql(cmd, "done")) return tj.done(obj.get("payload"));
    if (eql(cmd, "fail")) return tj.fail("not_found", text);
    if (eql(cmd, "failf")) return tj.failf("unsupported", "{s}={d} {s}", .{ "x", -42, text });
    if (eql(cmd, "bad_utf8")) return tj.done(.{ .bad = @as([]const u8, "a\xffb\xc3(\xed\xa0\x80c\xf0\x9f\x98"), .list = @as([]const []const u8, &.{"\xff"}) });
    if (eql(cmd, "error")) return error.Deliberate;
    if (eql(cmd, "page_text")) return tj.pageText(3, 4294967295);
    if (eql(cmd, "page_text_opt")) return tj.pageTextOpt(0, 7);
    if (eql(cmd, "page_image")) return tj.pageImage(1, 0);
    if (eql(cmd, "document_text")) return tj.documentText(9);
    if (eql(cmd, "resize")) return tj.imageResize(2, 512, 384);
    if (eql(cmd, "crop")) return tj.imageCrop(2, 1, 2, 3, 4294967295);
    if (eql(cmd, "fetch")) return tj.fetch(text);
    return tj.failf("unsupported", "unknown cmd {s}", .{cmd});
}

pub fn onToken(token: []const u8) tj.TokenAction {
    tokens += 1;
    return if (eql(token, "stop")) .stop else .@"continue";
}

pub fn step(ev: tj.Event) !tj.Command {
    return switch (ev) {
        .infer_done => |e| tj.emit(.{ .event = "infer_done", .text = e.text, .text_hex = hex(e.text), .tokens_out = e.tokens_out, .tool_calls = e.tool_calls, .logprobs = e.logprobs.len, .first_logprob = if (e.logprobs.len > 0) e.logprobs[0].logprob else null, .first_top = if (e.logprobs.len > 0) e.logprobs[0].top_logprobs.len else 0, .runner_up = if (e.logprobs.len > 0) e.logprobs[0].runner_up_logprob else null, .confidence_name = e.fieldConfidence("name"), .confidence_age = e.fieldConfidence("facts.age"), .kept = kept }),
        .opened => |e| tj.emit(.{ .event = "opened", .handle = e.handle, .len = e.len, .kind = e.kind.kind, .format = e.kind.format, .pages = e.kind.pages, .has_text_layer = e.kind.has_text_layer, .kept = kept }),
        .page_texted => |e| tj.emit(.{ .event = "page_texted", .text = e.text }),
        .page_text_attempted => |e| tj.emit(.{ .event = "page_text_attempted", .text = e.text, .@"error" = e.err }),
        .page_imaged => |e| tj.emit(.{ .event = "page_imaged", .handle = e.handle, .len = e.len }),
        .sliced => |e| tj.emit(.{ .event = "sliced", .text = e.text, .text_hex = hex(e.text), .next_offset = e.next_offset, .kept = kept }),
        .sliced_bytes => |e| tj.emit(.{ .event = "sliced_bytes", .bytes_hex = hex(e.bytes()), .next_offset = e.next_offset }),
        .embedded => |e| blk: {
            var dims: usize = 0;
            var sum: f64 = 0;
            for (e.vectors) |v| {
                dims += v.len;
                for (v) |x| sum += x;
            }
            break :blk tj.emit(.{ .event = "embedded", .vectors = e.vectors.len, .dims = dims, .sum = sum });
        },
        .emitted => tj.emit(.{ .event = "emitted", .tokens = tokens, .kept = kept }),
        .unknown => |name| tj.emit(.{ .event = "unknown", .name = name, .kept = kept }),
    };
}

comptime {
    tj.exportGuest(@This());
}
