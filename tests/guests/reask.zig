//! reask.zig -- reask.c on the Zig SDK: asks for a name with logprobs, and asks again (once) when the
//! model was unsure of it. Result: {"answer": "<the model's JSON>", "confidence": c or null, "asks": 1 or 2,
//! "tokens": N}
const std = @import("std");
const tj = @import("tensorjob");

var asks: u32 = 0;

fn ask() tj.Command {
    asks += 1;
    const prompt = if (asks == 1) "Who wrote it?" else "Who wrote it? Read again, carefully.";
    return tj.inferWith(prompt, 24, .{
        .format = tj.json(.{ .type = "json_schema", .name = "who", .schema = .{
            .type = "object",
            .properties = .{ .name = .{ .type = "string" } },
            .required = &[_][]const u8{"name"},
        } }),
        .logprobs = true,
        .top_logprobs = 2,
    });
}

pub fn init(input: std.json.Value) !tj.Command {
    _ = input;
    return ask();
}

pub fn step(ev: tj.Event) !tj.Command {
    switch (ev) {
        .infer_done => |e| {
            const confidence = e.fieldConfidence("name");
            if (confidence) |c| if (c < 0.5 and asks < 2) return ask();
            return tj.done(.{ .answer = e.text, .confidence = confidence, .asks = asks, .tokens = e.logprobs.len });
        },
        else => return tj.fail("unsupported", "unexpected event"),
    }
}

comptime {
    tj.exportGuest(@This());
}
