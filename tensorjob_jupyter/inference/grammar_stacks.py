"""llama.cpp's grammar stacks, counted in Python before llama.cpp has to carry them.

llama.cpp's grammar sampler keeps a set of parser *stacks*, one per way the
text so far can be read by the grammar, and every call into it costs time
in proportion to them: accepting a token expands and de-duplicates them
(quadratic in their number), and checking candidates walks each of them
(the whole vocabulary, in a full pass). A C call cannot be interrupted, so
a grammar that makes tens of thousands of stacks holds the model's thread
for as long as it likes, after its job has ended.

``GrammarStacks`` is that machine's model: the grammar parsed as llama.cpp's
``llama_grammar_parser`` parses it (the same rules, the same synthesized
rules for groups and repetitions, so a stack here is a stack there), and
``llama_grammar_advance_stack`` / ``llama_grammar_accept_token`` replayed on
each accepted token. The sampler runs it *first*: if the next step would
leave more than ``max_stacks`` stacks, or take more than ``max_work`` stack
expansions, ``GrammarTooCostly`` is raised and llama.cpp is never asked.
The model's own work is bounded by the same counts, so it costs a little
Python per token (tens of microseconds for ordinary JSON grammars).

Only what the host's grammars use is modelled (characters, classes, rule
references, groups, ``?``, ``*``, ``+``, ``{m,n}``, ``.``); a grammar with
llama.cpp's token syntax (``<...>``) is refused as unmodelled.
"""

from __future__ import annotations

import sys
from array import array

END, ALT, RULE_REF, CHAR, CHAR_NOT, CHAR_RNG_UPPER, CHAR_ALT, CHAR_ANY = range(8)
#: llama.cpp's own bound on expanded repetitions (MAX_REPETITION_THRESHOLD in llama-grammar.cpp).
MAX_REPETITION_THRESHOLD = 2000
#: Character classes a parsed grammar keeps decoded (those of the stacks' tops, in practice).
CLASS_CACHE = 4096


class GrammarTooCostly(Exception):
    """The next step would leave llama.cpp's grammar more stacks, or more work, than allowed."""


class GrammarSyntaxError(ValueError):
    """A grammar this model does not parse (llama.cpp decides whether it is valid)."""


# --- the parser: llama_grammar_parser, on the grammar's UTF-8 bytes ---------------------------------------


def _is_word(c: int) -> bool:
    return 0x61 <= c <= 0x7A or 0x41 <= c <= 0x5A or c == 0x2D or 0x30 <= c <= 0x39


def _decode_one(src: bytes, pos: int) -> tuple[int, int]:
    """decode_utf8(const char *): a code point and where the next one starts (lenient, as llama.cpp)."""
    lookup = (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)
    first = src[pos]
    n = lookup[first >> 4]
    value = first & ((1 << (8 - n)) - 1)
    end = pos + n
    pos += 1
    while pos < end and pos < len(src) and src[pos]:
        value = (value << 6) + (src[pos] & 0x3F)
        pos += 1
    return value, pos


class _Frame:
    """One rule being parsed: its elements, and where its last symbol began (for a repetition)."""

    def __init__(self, rule_id: int, nested: bool, before: int | None):
        self.rule_id = rule_id
        self.nested = nested
        self.before = before  # symbols defined before this group began (how many rules it made)
        self.rule: list[tuple[int, int]] = []
        self.last_sym_start = 0
        self.n_prev_rules = 1


class _Parser:
    def __init__(self, src: bytes):
        self.src = src + b"\0"
        self.symbol_ids: dict[bytes, int] = {}
        self.rules: list[list[tuple[int, int]]] = []

    def fail(self, message: str, pos: int) -> GrammarSyntaxError:
        return GrammarSyntaxError(f"{message} at byte {pos}")

    def space(self, pos: int, newline_ok: bool) -> int:
        src = self.src
        while src[pos] in b" \t#" or (newline_ok and src[pos] in b"\r\n"):
            if src[pos] == 0x23:  # '#': a comment to the end of the line
                while src[pos] and src[pos] not in b"\r\n":
                    pos += 1
            else:
                pos += 1
        return pos

    def name(self, pos: int) -> int:
        end = pos
        while _is_word(self.src[end]):
            end += 1
        if end == pos:
            raise self.fail("expecting name", pos)
        return end

    def symbol(self, name: bytes) -> int:
        return self.symbol_ids.setdefault(name, len(self.symbol_ids))

    def generate(self, base: bytes) -> int:
        next_id = len(self.symbol_ids)
        self.symbol_ids[base + b"_" + str(next_id).encode()] = next_id
        return next_id

    def add_rule(self, rule_id: int, rule: list) -> None:
        while len(self.rules) <= rule_id:
            self.rules.append([])
        self.rules[rule_id] = rule

    def char(self, pos: int) -> tuple[int, int]:
        src = self.src
        if src[pos] == 0x5C:  # backslash
            e = src[pos + 1]
            sizes = {0x78: 2, 0x75: 4, 0x55: 8}  # x u U
            if e in sizes:
                size = sizes[e]
                digits = src[pos + 2:pos + 2 + size]
                try:
                    if len(digits) != size:
                        raise ValueError
                    return int(digits, 16), pos + 2 + size
                except ValueError:
                    raise self.fail("expecting hex chars", pos) from None
            simple = {0x74: 9, 0x72: 13, 0x6E: 10}
            if e in simple:
                return simple[e], pos + 2
            if e in b'\\"[]-':
                return e, pos + 2
            raise self.fail("unknown escape", pos)
        if src[pos]:
            return _decode_one(src, pos)
        raise self.fail("unexpected end of input", pos)

    def alternates(self, pos: int, rule_name: bytes, rule_id: int, nested: bool) -> int:
        """parse_alternates, with the recursion into groups kept on a list (groups nest as deep as a
        grammar likes: a string of ``maxLength`` 512 is 512 groups deep)."""
        frames = [_Frame(rule_id, nested, None)]
        src = self.src
        while True:
            frame = frames[-1]
            pos, opened = self.sequence(pos, rule_name, frame)
            if opened:  # '(' : its alternates make a synthesized rule
                before = len(self.symbol_ids)
                frames.append(_Frame(self.generate(rule_name), True, before))
                continue
            if src[pos] == 0x7C:  # '|'
                frame.rule.append((ALT, 0))
                frame.last_sym_start, frame.n_prev_rules = len(frame.rule), 1
                pos = self.space(pos + 1, True)
                continue
            frame.rule.append((END, 0))
            self.add_rule(frame.rule_id, frame.rule)
            frames.pop()
            if not frames:
                return pos
            parent = frames[-1]
            parent.n_prev_rules = max(1, len(self.symbol_ids) - frame.before)
            parent.last_sym_start = len(parent.rule)
            parent.rule.append((RULE_REF, frame.rule_id))
            if src[pos] != 0x29:
                raise self.fail("expecting ')'", pos)
            pos = self.space(pos + 1, parent.nested)

    def sequence(self, pos: int, rule_name: bytes, frame: "_Frame") -> tuple[int, bool]:
        """parse_sequence into ``frame``, up to its end (False) or up to a group's '(' (True: the group is
        parsed next, then this sequence goes on)."""
        src = self.src
        rule, nested = frame.rule, frame.nested

        def repeat(low: int, high: int | None) -> None:
            if frame.last_sym_start == len(rule):
                raise self.fail("expecting preceding item to */+/?/{", pos)
            prev = rule[frame.last_sym_start:]
            total = high if high is not None and high > 0 else low if low > 0 else 1
            if frame.n_prev_rules * total > MAX_REPETITION_THRESHOLD:
                raise self.fail("repetition exceeds llama.cpp's threshold", pos)
            if low == 0:
                del rule[frame.last_sym_start:]
            else:
                for _ in range(1, low):
                    rule.extend(prev)
            last_rec = 0
            n_opt = 1 if high is None else high - low
            for i in range(n_opt):
                rec_id = self.generate(rule_name)
                rec = list(prev)
                if i > 0 or high is None:
                    rec.append((RULE_REF, rec_id if high is None else last_rec))
                rec += [(ALT, 0), (END, 0)]
                self.add_rule(rec_id, rec)
                last_rec = rec_id
            if n_opt > 0:
                rule.append((RULE_REF, last_rec))
            frame.n_prev_rules *= total

        while src[pos]:
            c = src[pos]
            if c == 0x22:  # '"': a literal
                pos += 1
                frame.last_sym_start, frame.n_prev_rules = len(rule), 1
                while src[pos] != 0x22:
                    if not src[pos]:
                        raise self.fail("unexpected end of input", pos)
                    value, pos = self.char(pos)
                    rule.append((CHAR, value))
                pos = self.space(pos + 1, nested)
            elif c == 0x5B:  # '[': a class
                pos += 1
                start_type = CHAR
                if src[pos] == 0x5E:  # '^'
                    pos += 1
                    start_type = CHAR_NOT
                frame.last_sym_start, frame.n_prev_rules = len(rule), 1
                while src[pos] != 0x5D:  # ']'
                    if not src[pos]:
                        raise self.fail("unexpected end of input", pos)
                    value, pos = self.char(pos)
                    rule.append((CHAR_ALT if frame.last_sym_start < len(rule) else start_type, value))
                    if src[pos] == 0x2D and src[pos + 1] != 0x5D:  # '-' not before ']'
                        if not src[pos + 1]:
                            raise self.fail("unexpected end of input", pos)
                        high, pos = self.char(pos + 1)
                        rule.append((CHAR_RNG_UPPER, high))
                pos = self.space(pos + 1, nested)
            elif c in (0x3C, 0x21):  # '<' or '!': a token
                raise self.fail("token syntax is not modelled", pos)
            elif _is_word(c):
                end = self.name(pos)
                ref = self.symbol(src[pos:end])
                pos = self.space(end, nested)
                frame.last_sym_start, frame.n_prev_rules = len(rule), 1
                rule.append((RULE_REF, ref))
            elif c == 0x28:  # '(': a group, parsed by the caller as a synthesized rule
                return self.space(pos + 1, True), True
            elif c == 0x2E:  # '.'
                frame.last_sym_start, frame.n_prev_rules = len(rule), 1
                rule.append((CHAR_ANY, 0))
                pos = self.space(pos + 1, nested)
            elif c in (0x2A, 0x2B, 0x3F):  # * + ?
                pos = self.space(pos + 1, nested)
                repeat(*{0x2A: (0, None), 0x2B: (1, None), 0x3F: (0, 1)}[c])
            elif c == 0x7B:  # '{'
                pos = self.space(pos + 1, nested)
                end = pos
                while 0x30 <= src[end] <= 0x39:
                    end += 1
                if end == pos:
                    raise self.fail("expecting an int", pos)
                low = int(src[pos:end])
                high: int | None = None
                pos = self.space(end, nested)
                if src[pos] == 0x7D:
                    high = low
                    pos = self.space(pos + 1, nested)
                elif src[pos] == 0x2C:
                    pos = self.space(pos + 1, nested)
                    end = pos
                    while 0x30 <= src[end] <= 0x39:
                        end += 1
                    if end > pos:
                        high = int(src[pos:end])
                        pos = self.space(end, nested)
                    if src[pos] != 0x7D:
                        raise self.fail("expecting '}'", pos)
                    pos = self.space(pos + 1, nested)
                else:
                    raise self.fail("expecting ','", pos)
                if low > MAX_REPETITION_THRESHOLD:
                    raise self.fail("repetition exceeds llama.cpp's threshold", pos)
                if high is not None and high > MAX_REPETITION_THRESHOLD:
                    high = None
                repeat(low, high)
            else:
                break
        return pos, False

    def parse(self) -> None:
        pos = self.space(0, True)
        src = self.src
        while src[pos]:
            end = self.name(pos)
            rule_id = self.symbol(src[pos:end])
            name = src[pos:end]
            pos = self.space(end, False)
            if src[pos:pos + 3] != b"::=":
                raise self.fail("expecting ::=", pos)
            pos = self.alternates(self.space(pos + 3, True), name, rule_id, False)
            if src[pos] == 0x0D:
                pos += 2 if src[pos + 1] == 0x0A else 1
            elif src[pos] == 0x0A:
                pos += 1
            elif src[pos]:
                raise self.fail("expecting newline or end", pos)
            pos = self.space(pos, True)
        for rule in self.rules:
            if not rule:
                raise self.fail("undefined rule", 0)
            for kind, value in rule:
                if kind == RULE_REF and (value >= len(self.rules) or not self.rules[value]):
                    raise self.fail("undefined rule", 0)


class ParsedGrammar:
    """A grammar's rules as llama.cpp lays them out, flattened: one position per element."""

    def __init__(self, gbnf: str, root: str = "root"):
        parser = _Parser(gbnf.encode("utf-8"))
        parser.parse()
        root_id = parser.symbol_ids.get(root.encode())
        if root_id is None:
            raise GrammarSyntaxError(f"the grammar has no {root!r} rule")
        types, values, starts = array("b"), array("I"), []
        for rule in parser.rules:
            starts.append(len(types))
            for kind, value in rule:
                types.append(kind)
                values.append(value)
        self.types, self.values = types, values
        self.is_end = bytes(t in (END, ALT) for t in types)
        # each rule's alternatives, by the position each begins at
        self.alternatives: list[tuple[int, ...]] = []
        for start in starts:
            alts, pos = [start], start
            while True:
                while not self.is_end[pos]:
                    pos += 1
                if types[pos] == ALT:
                    pos += 1
                    alts.append(pos)
                else:
                    break
            self.alternatives.append(tuple(alts))
        self.root = root_id
        self.size = len(types)
        self._classes: dict[int, tuple[bool, tuple, int]] = {}
        #: what this object holds, roughly (its arrays, its alternatives, the classes it keeps)
        self.nbytes = (len(types) * 6 + sys.getsizeof(self.alternatives)
                       + sum(sys.getsizeof(a) + 28 * len(a) for a in self.alternatives) + CLASS_CACHE * 200)

    def char_class(self, pos: int) -> tuple[bool, tuple, int]:
        """The terminal at ``pos``: (positive, its ranges, the position after it); the last
        ``CLASS_CACHE`` used are kept."""
        found = self._classes.get(pos)
        if found is None:
            if len(self._classes) >= CLASS_CACHE:
                self._classes.clear()
            found = self._classes[pos] = self._class_at(pos)
        return found

    def _class_at(self, pos: int) -> tuple[bool, tuple, int]:
        types, values = self.types, self.values
        positive = types[pos] in (CHAR, CHAR_ANY)
        ranges = []
        while True:
            if types[pos + 1] == CHAR_RNG_UPPER:
                ranges.append((values[pos], values[pos + 1]))
                pos += 2
            elif types[pos] == CHAR_ANY:
                ranges.append((0, 0x7FFFFFFF))
                pos += 1
            else:
                ranges.append((values[pos], values[pos]))
                pos += 1
            if types[pos] != CHAR_ALT:
                break
        return positive, tuple(ranges), pos


# --- the stacks --------------------------------------------------------------------------------------


_UTF8_LENGTHS = (1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 2, 2, 3, 4)


def decode_utf8(data: bytes, partial: tuple[int, int]) -> tuple[list[int], tuple[int, int]]:
    """llama.cpp's decode_utf8(std::string, partial): the code points llama.cpp goes on to accept (none
    for an invalid sequence) and the partial character left over, as (value, bytes still needed)."""
    value, remain = partial
    out: list[int] = []
    i, n = 0, len(data)
    while i < n and data[i] and remain > 0:
        b = data[i]
        if b >> 6 != 2:
            return [], (0, -1)  # invalid: llama.cpp accepts no character of it
        value = (value << 6) + (b & 0x3F)
        i += 1
        remain -= 1
    if partial[1] > 0 and remain == 0:
        out.append(value)
    while i < n and data[i]:
        b = data[i]
        remain = _UTF8_LENGTHS[b >> 4] - 1
        if remain < 0:
            return [], (0, remain)
        value = b & ((1 << (7 - remain)) - 1)
        i += 1
        while i < n and data[i] and remain > 0:
            value = (value << 6) + (data[i] & 0x3F)
            i += 1
            remain -= 1
        if remain == 0:
            out.append(value)
    return out, (value, remain)


class GrammarStacks:
    """The stacks llama.cpp's grammar holds, advanced token by token, within bounds.

    ``max_stacks``: the most stacks any step may leave (and any expansion
    reach); ``max_work``: the most stack expansions one step may take (the
    initial expansion, or one token's characters). ``work`` is what the last
    step took; ``peak`` the most stacks seen so far.
    """

    def __init__(self, grammar: ParsedGrammar, *, max_stacks: int, max_work: int):
        self.g = grammar
        self.max_stacks = max_stacks
        self.max_work = max_work
        self.work = 0
        self.peak = 0
        self.partial = (0, 0)
        g = grammar
        self.work = 0
        stacks: dict[tuple, None] = {}
        for alt in g.alternatives[g.root]:
            self._advance(() if g.is_end[alt] else (alt,), stacks)
        self.stacks = list(stacks)
        self.peak = len(self.stacks)

    def _advance(self, stack: tuple, out: dict) -> None:
        """llama_grammar_advance_stack: every stack ``stack`` expands to, topped by a character, into ``out``."""
        g = self.g
        types, values, is_end, alternatives = g.types, g.values, g.is_end, g.alternatives
        todo = [stack]
        seen: set[tuple] = set()
        while todo:
            cur = todo.pop()
            if cur in seen:
                continue
            seen.add(cur)
            self.work += 1
            if self.work > self.max_work:
                raise GrammarTooCostly(f"expanding the grammar's stacks takes more than {self.max_work} steps "
                                       f"for one token")
            if not cur:
                out[cur] = None
                continue
            pos = cur[-1]
            if types[pos] == RULE_REF:
                base = cur[:-1] if is_end[pos + 1] else cur[:-1] + (pos + 1,)
                for sub in alternatives[values[pos]]:
                    todo.append(base if is_end[sub] else base + (sub,))
            else:
                out[cur] = None
                if len(out) > self.max_stacks:
                    raise GrammarTooCostly(f"the grammar would carry more than {self.max_stacks} parser stacks")

    def accept(self, piece: bytes) -> None:
        """llama_grammar_accept_token for a token whose bytes are ``piece``; ``GrammarTooCostly`` before
        a step past the bounds (the model is then unchanged)."""
        g = self.g
        char_class, is_end = g.char_class, g.is_end
        code_points, partial = decode_utf8(piece, self.partial)
        self.work = 0
        new: dict[tuple, None] = {}
        for stack in self.stacks:
            if not stack:
                continue
            current = [stack]
            for cp in code_points:
                following: dict[tuple, None] = {}
                for cur in current:
                    if not cur:
                        continue
                    positive, ranges, after = char_class(cur[-1])
                    found = False
                    for low, high in ranges:
                        if low <= cp <= high:
                            found = True
                            break
                    if found == positive:
                        self._advance(cur[:-1] if is_end[after] else cur[:-1] + (after,), following)
                current = list(following)
                if not current:
                    break
            for s in current:
                new[s] = None
            if len(new) > self.max_stacks:
                raise GrammarTooCostly(f"the grammar would carry more than {self.max_stacks} parser stacks")
        self.stacks = list(new)
        self.partial = partial
        self.peak = max(self.peak, len(self.stacks))

    def allows(self, piece: bytes) -> bool:
        """Whether accepting ``piece`` would leave any stack (the model is left as it was)."""
        stacks, partial = self.stacks, self.partial
        try:
            self.accept(piece)
            return bool(self.stacks)
        finally:
            self.stacks, self.partial = stacks, partial

    @property
    def count(self) -> int:
        return len(self.stacks)
