"""A schema's string ``pattern`` as a deterministic automaton, and that automaton as grammar rules.

llama.cpp's grammar sampler is a nondeterministic pushdown parser: it carries
one *stack* per way the text so far could have been parsed, and checking a
token costs time in proportion to the stacks (and, for the whole vocabulary,
to the stacks times the vocabulary; a candidate's later characters are checked
once per way its earlier ones were matched). A pattern translated rule for
rule, as llama-cpp-python's converter does, keeps every ambiguity of the
regular expression: ``^((a?){0,256}){0,256}$`` builds a grammar of 1 KB that
carries tens of thousands of stacks once its string opens, and one token then
costs the shared model's thread minutes.

So a pattern is compiled here into a deterministic automaton first (positions
of a Glushkov automaton, then the subset construction over an alphabet cut at
every class boundary) and that automaton becomes the grammar: one rule per
state, one alternative per target state, with character classes that never
overlap. Inside the pattern the grammar then carries exactly one stack per
alternative of the current state, and a candidate's characters are matched
along one path: the grammar's work per token is linear in the token whatever
the pattern.

What this costs the host is bounded and *measured* as it is built: the
positions the pattern expands to (counted repetition copies its operand), the
automaton's states and the work of the construction, each refused past its
bound with ``PatternError`` (the schema check turns that into
``schema_validation_failed``). The accepted syntax is the subset the schema
check allows: literal characters, escaped punctuation, ``\\d``, ``\\w``,
classes without negation, groups, ``|``, ``*``, ``+``, ``?``, ``{n}``,
``{n,}``, ``{n,m}`` (a lazy ``?`` after a quantifier changes no language).
``\\d`` and ``\\w`` are held to ASCII, a subset of what Python's ``re`` (which
validates the output) accepts, so output made under the grammar always matches.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

#: The most character positions a pattern may expand to (``x{0,256}`` is 256 copies of ``x``).
MAX_PATTERN_POSITIONS = 1024
#: The most states its deterministic automaton may have (each becomes one grammar rule).
MAX_PATTERN_STATES = 1024
#: The most work units (position-set unions and class look-ups) building the automata of one schema may take.
MAX_PATTERN_WORK = 200_000
#: The deepest groups may nest (Python's own ``re`` fails near 500).
MAX_PATTERN_DEPTH = 32

DIGITS = ((0x30, 0x39),)
WORD = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
ESCAPABLE = set(".-+*?()[]{}|^$/")
MAX_CODE_POINT = 0x10FFFF


class PatternError(ValueError):
    """A pattern outside the supported subset, or one whose automaton would be too large."""


# --- parsing: the pattern's body into a small tree --------------------------------------------------


@dataclass(frozen=True)
class _Node:
    kind: str  # set, cat, alt, star, plus, opt, rep
    items: tuple = ()
    ranges: tuple = ()  # for set: ((low, high), ...)
    low: int = 0  # for rep
    high: int | None = None


_EMPTY = _Node("cat")


class _Parser:
    def __init__(self, body: str):
        self.s = body
        self.i = 0
        self.depth = 0

    def fail(self, message: str) -> PatternError:
        return PatternError(f"{message} at offset {self.i + 1} of the pattern")

    def parse(self) -> _Node:
        node = self.alternation()
        if self.i < len(self.s):
            raise self.fail("unbalanced ')'")
        return node

    def alternation(self) -> _Node:
        branches = [self.sequence()]
        while self.i < len(self.s) and self.s[self.i] == "|":
            self.i += 1
            branches.append(self.sequence())
        return branches[0] if len(branches) == 1 else _Node("alt", tuple(branches))

    def sequence(self) -> _Node:
        items: list[_Node] = []
        while self.i < len(self.s) and self.s[self.i] not in "|)":
            items.append(self.quantified(self.atom()))
        return items[0] if len(items) == 1 else _Node("cat", tuple(items))

    def atom(self) -> _Node:
        s, c = self.s, self.s[self.i]
        if c == "(":
            self.i += 1
            if self.i < len(s) and s[self.i] == "?":
                raise self.fail("group flags and lookarounds (?...) are not supported")
            self.depth += 1
            if self.depth > MAX_PATTERN_DEPTH:
                raise self.fail(f"groups nest more than {MAX_PATTERN_DEPTH} deep")
            inner = self.alternation()
            if self.i >= len(s) or s[self.i] != ")":
                raise self.fail("missing ')'")
            self.i += 1
            self.depth -= 1
            return inner
        if c == "[":
            return self.char_class()
        if c == "\\":
            if self.i + 1 >= len(s):
                raise self.fail("a lone backslash")
            e = s[self.i + 1]
            self.i += 2
            if e == "d":
                return _Node("set", ranges=DIGITS)
            if e == "w":
                return _Node("set", ranges=WORD)
            if e in ESCAPABLE:
                return _Node("set", ranges=((ord(e), ord(e)),))
            raise self.fail(f"the escape \\{e} is not supported")
        if c in "*+?{":
            raise self.fail("nothing to repeat")
        if c in "^$":
            raise self.fail(f"'{c}' inside the pattern is an anchor; anchors are supported only at its ends "
                            f"(escape it, \\{c}, for the character)")
        if c in ".]}\"":
            raise self.fail(f"{c!r} is not supported")
        self.i += 1
        return _Node("set", ranges=((ord(c), ord(c)),))

    def char_class(self) -> _Node:
        s = self.s
        self.i += 1
        if self.i < len(s) and s[self.i] == "^":
            raise self.fail("negated classes are not supported")
        parts: list[tuple[int, int]] = []
        first = True
        while True:
            if self.i >= len(s):
                raise self.fail("missing ']'")
            c = s[self.i]
            if c == "]" and not first:
                self.i += 1
                break
            first = False
            if c == "\\":
                if self.i + 1 >= len(s):
                    raise self.fail("a lone backslash")
                e = s[self.i + 1]
                self.i += 2
                if e in "dw":
                    parts.extend(DIGITS if e == "d" else WORD)
                    continue
                if e not in ESCAPABLE:
                    raise self.fail(f"the escape \\{e} is not supported in a class")
                code = ord(e)
            else:
                self.i += 1
                code = ord(c)
            # a range: this character, '-', another single character (not the class's end)
            if (self.i + 1 < len(s) and s[self.i] == "-" and s[self.i + 1] != "]"):
                self.i += 1
                h = s[self.i]
                if h == "\\":
                    if self.i + 1 >= len(s) or s[self.i + 1] not in ESCAPABLE:
                        raise self.fail("a class range must end at a single character")
                    high = ord(s[self.i + 1])
                    self.i += 2
                else:
                    high = ord(h)
                    self.i += 1
                if high < code:
                    raise self.fail("a class range runs backwards")
                parts.append((code, high))
            else:
                parts.append((code, code))
        return _Node("set", ranges=_merge(parts))

    def quantified(self, node: _Node) -> _Node:
        """``node`` with the quantifier that follows it, if any; one lazy ``?`` after it changes nothing."""
        s = self.s
        if self.i >= len(s) or s[self.i] not in "*+?{":
            return node
        c = s[self.i]
        if c in "*+?":
            self.i += 1
            node = _Node({"*": "star", "+": "plus", "?": "opt"}[c], (node,))
        else:
            end = s.find("}", self.i)
            if end < 0:
                raise self.fail("missing '}'")
            text = s[self.i + 1:end]
            low_text, comma, high_text = text.partition(",")
            if not low_text.isdigit() or (high_text and not high_text.isdigit()):
                raise self.fail(f"the repetition {{{text}}} is not {{n}}, {{n,}} or {{n,m}}")
            low = int(low_text)
            high = None if comma and not high_text else int(high_text) if comma else low
            if high is not None and high < low:
                raise self.fail(f"the repetition {{{text}}} runs backwards")
            self.i = end + 1
            node = _Node("rep", (node,), low=low, high=high)
        if self.i < len(s) and s[self.i] == "?":
            self.i += 1  # lazy: the same language
        if self.i < len(s) and s[self.i] in "*+?{":
            raise self.fail("multiple repeat")
        return node


def _merge(ranges) -> tuple:
    out: list[list[int]] = []
    for low, high in sorted(ranges):
        if out and low <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], high)
        else:
            out.append([low, high])
    return tuple((a, b) for a, b in out)


def _positions(node: _Node) -> int:
    """How many character positions ``node`` expands to (counted repetitions copy their operand)."""
    if node.kind == "set":
        return 1
    if node.kind in ("cat", "alt"):
        return sum(_positions(n) for n in node.items)
    inner = _positions(node.items[0])
    if node.kind == "rep":
        return inner * (node.high if node.high is not None else max(node.low, 1))
    return inner


# --- the automaton -----------------------------------------------------------------------------------


class PatternBudget:
    """The work building automata may take, shared by every pattern of one schema (its host work is bounded
    as a whole, however many patterns it holds)."""

    def __init__(self, limit: int = MAX_PATTERN_WORK):
        self.limit = limit
        self.left = limit

    def spend(self, units: int) -> None:
        self.left -= units
        if self.left < 0:
            raise PatternError(f"building the automata of the schema's patterns takes more than {self.limit} "
                               f"steps; simplify them (fewer nested or overlapping repetitions)")


class _Glushkov:
    """Positions, and which positions may follow which, as Python ints used as bit sets."""

    def __init__(self, budget: PatternBudget):
        self.classes: list[tuple] = []
        self.follow: list[int] = []
        self.budget = budget

    def build(self, node: _Node) -> tuple[bool, int, int]:
        """(nullable, first positions, last positions) of ``node``, adding its positions and follows."""
        kind = node.kind
        if kind == "set":
            p = len(self.classes)
            self.classes.append(node.ranges)
            self.follow.append(0)
            return False, 1 << p, 1 << p
        if kind == "alt":
            nullable, first, last = False, 0, 0
            for item in node.items:
                n, f, l_ = self.build(item)
                nullable, first, last = nullable or n, first | f, last | l_
            return nullable, first, last
        if kind == "cat":
            return self._sequence([lambda item=item: self.build(item) for item in node.items])
        if kind in ("star", "plus"):
            n, f, l_ = self.build(node.items[0])
            self._link(l_, f)
            return kind == "star" or n, f, l_
        if kind == "opt":
            _, f, l_ = self.build(node.items[0])
            return True, f, l_
        inner, low, high = node.items[0], node.low, node.high  # rep
        parts = [lambda: self.build(inner)] * low
        if high is None:
            if low:
                parts[-1] = lambda: self.build(_Node("plus", (inner,)))
            else:
                parts.append(lambda: self.build(_Node("star", (inner,))))
        elif high > low:
            parts.append(lambda: self._optional_chain(inner, high - low))
        return self._sequence(parts)

    def _optional_chain(self, inner: _Node, count: int) -> tuple[bool, int, int]:
        """``inner`` up to ``count`` times, as ``(x (x (x)?)?)?``: the same language as ``x? x? x?``, with one
        follow link per copy where the flat form links every copy to every one after it."""
        copies = [self.build(inner) for _ in range(count)]
        _, first, last = copies[-1]  # the innermost (x)?
        for n, f, l_ in reversed(copies[:-1]):  # (x R)? with R nullable
            self._link(l_, first)
            first = f | first if n else f
            last = last | l_
        return True, first, last

    def _sequence(self, parts) -> tuple[bool, int, int]:
        nullable, first, last = True, 0, 0
        for part in parts:
            n, f, l_ = part()
            self._link(last, f)
            first = first | f if nullable else first
            last = l_ | last if n else l_
            nullable = nullable and n
        return nullable, first, last

    def _link(self, sources: int, targets: int) -> None:
        """Every position in ``sources`` may be followed by every one in ``targets``."""
        if not targets or not sources:
            return
        self.budget.spend(sources.bit_count())
        follow = self.follow
        for p in _bits(sources):
            follow[p] |= targets


@dataclass
class Automaton:
    """A deterministic automaton: ``transitions[s]`` lists ``(ranges, target)`` with disjoint ranges."""

    transitions: list[list[tuple[tuple, int]]]
    accepting: list[bool]
    positions: int

    @property
    def states(self) -> int:
        return len(self.transitions)

    @property
    def max_branches(self) -> int:
        """The most alternatives one state's rule has: the stacks the grammar carries inside the pattern."""
        return max(len(t) + (1 if a else 0) for t, a in zip(self.transitions, self.accepting))


def _bits(value: int):
    """The positions set in ``value``, lowest first."""
    text = bin(value)[:1:-1]
    i = text.find("1")
    while i >= 0:
        yield i
        i = text.find("1", i + 1)


def pattern_automaton(pattern: str, budget: PatternBudget | None = None) -> Automaton:
    """The deterministic automaton of an anchored pattern ``^...$``; ``PatternError`` names what is wrong.
    ``budget``: the work it may take, shared with the schema's other patterns (a fresh one if None)."""
    if not (isinstance(pattern, str) and len(pattern) >= 2 and pattern[0] == "^" and pattern[-1] == "$"):
        raise PatternError("a pattern must be anchored, ^...$")
    body = pattern[1:-1]
    if (len(body) - len(body.rstrip("\\"))) % 2:
        raise PatternError("a pattern must be anchored, ^...$ (its final $ is escaped)")
    try:
        return _automaton(body, budget if budget is not None else PatternBudget())
    except RecursionError:  # pragma: no cover - MAX_PATTERN_DEPTH keeps the tree shallow
        raise PatternError("the pattern is nested too deeply") from None


def _automaton(body: str, budget: PatternBudget) -> Automaton:
    tree = _Parser(body).parse()
    positions = _positions(tree)
    if positions > MAX_PATTERN_POSITIONS:
        raise PatternError(f"it expands to {positions} character positions (repetitions copy what they repeat), "
                           f"over the {MAX_PATTERN_POSITIONS} allowed; use smaller or fewer nested repetitions")
    g = _Glushkov(budget)
    nullable, first, last = g.build(tree)
    # the alphabet, cut at every class boundary: atoms are maximal runs of characters no class splits
    cuts = sorted({b for ranges in g.classes for low, high in ranges for b in (low, high + 1)})
    holders = [0] * max(len(cuts) - 1, 0)  # per atom: the positions whose class holds it
    for p, ranges in enumerate(g.classes):
        for low, high in ranges:
            first_atom, end_atom = bisect.bisect_left(cuts, low), bisect.bisect_left(cuts, high + 1)
            budget.spend(end_atom - first_atom)
            for a in range(first_atom, end_atom):
                holders[a] |= 1 << p
    atoms = [(a, h) for a, h in enumerate(holders) if h]
    index: dict[int, int] = {}
    order: list[int] = []
    transitions: list[list[tuple[tuple, int]]] = []
    accepting: list[bool] = []
    start = -1  # "nothing matched yet": its successors are the first positions

    def state_id(key: int) -> int:
        found = index.get(key)
        if found is None:
            if len(order) >= MAX_PATTERN_STATES:
                raise PatternError(f"its automaton has more than {MAX_PATTERN_STATES} states; simplify the "
                                   f"pattern (fewer overlapping repetitions or alternatives)")
            found = index[key] = len(order)
            order.append(key)
        return found

    state_id(start)
    done = 0
    while done < len(order):
        key = order[done]
        done += 1
        if key == start:
            following, is_accepting = first, nullable
        else:
            following = 0
            for p in _bits(key):
                following |= g.follow[p]
            is_accepting = bool(key & last)
        budget.spend((key.bit_count() if key != start else 0) + len(atoms))
        by_target: dict[int, list[int]] = {}
        for a, held in atoms:
            target = following & held
            if target:
                by_target.setdefault(target, []).append(a)
        out = []
        for target, cut in by_target.items():
            out.append((_merge((cuts[a], cuts[a + 1] - 1) for a in cut), state_id(target)))
        out.sort(key=lambda t: t[0])
        transitions.append(out)
        accepting.append(is_accepting)
    return Automaton(transitions, accepting, positions)


# --- the automaton as GBNF -----------------------------------------------------------------------------


def _char(code: int) -> str:
    if (0x30 <= code <= 0x39) or (0x41 <= code <= 0x5A) or (0x61 <= code <= 0x7A):
        return chr(code)
    if code < 0x100:
        return f"\\x{code:02X}"
    if code < 0x10000:
        return f"\\u{code:04X}"
    return f"\\U{code:08X}"


def _class(ranges: tuple) -> str:
    return "[" + "".join(_char(a) if a == b else f"{_char(a)}-{_char(b)}" for a, b in ranges) + "]"


def automaton_rules(automaton: Automaton, prefix: str) -> tuple[str, dict[str, str]]:
    """(the start rule's name, {rule name: GBNF body}) for ``automaton``, rules named ``prefix-N``.

    An accepting state with no way on (where the match must end) is never
    referenced: the transition into it is the character class alone.
    """
    final = [a and not t for t, a in zip(automaton.transitions, automaton.accepting)]
    rules: dict[str, str] = {}
    for state, (moves, is_accepting) in enumerate(zip(automaton.transitions, automaton.accepting)):
        if final[state] and state:
            continue
        alternatives = [_class(ranges) if final[target] else f"{_class(ranges)} {prefix}-{target}"
                        for ranges, target in moves]
        if is_accepting:
            alternatives.append('""')
        rules[f"{prefix}-{state}"] = " | ".join(alternatives)
    return f"{prefix}-0", rules
