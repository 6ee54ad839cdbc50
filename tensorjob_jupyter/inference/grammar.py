"""Constrained decoding: a JSON Schema as a llama.cpp grammar, and the sampler that enforces it, within bounds.

A request's ``Constraint`` (a JSON Schema the host checked) becomes a GBNF
grammar through llama-cpp-python's JSON-schema converter
(``llama_grammar.SchemaConverter``), with one change: a string ``pattern``
becomes a deterministic automaton (``pattern.py``), never the converter's
rule-for-rule translation, whose ambiguity llama.cpp would pay for in
stacks. The grammar is parsed by llama.cpp's grammar sampler before any
token is generated (a grammar it refuses is a ``ConstraintError``).

**The shared model's thread is bounded.** The grammar runs on the model's
one thread, inside C calls nothing can interrupt, so every call is bounded
before it is made:

* the stacks llama.cpp's grammar will carry are counted first, in Python
  (``grammar_stacks.GrammarStacks``, a model of llama.cpp's parser and
  stack machine): the initial stacks when the sampler is made, then each
  token's before llama.cpp accepts it. Past ``MAX_GRAMMAR_STACKS`` stacks or
  ``MAX_GRAMMAR_WORK`` stack expansions for one token the request fails with
  ``ConstraintError`` (``schema_validation_failed``) and llama.cpp never
  takes the step;
* the full-vocabulary pass is cut into chunks whose size adapts to what one
  costs (about ``CHUNK_TARGET_S`` each) and only spans tokens whose first
  byte the grammar can take (asked once per byte, with a one-byte token);
  between chunks the sampler looks at whether its request was abandoned
  (the job ended: ``Abandoned``, the engine ends the request at once) and at
  the time the token has taken (past ``MAX_GRAMMAR_SECONDS`` it is a
  ``ConstraintError``).

Checking the whole vocabulary against a grammar costs more than a token of
this model, so each token is first sampled freely and only checked: the
grammar sees the whole vocabulary only when the free choice is one it
rejects (``GrammarSampler``); greedy decoding gets the same token at a
fraction of the cost.

What is remembered between requests -- a schema's grammar, a grammar's
parsed rules -- is kept in memos bounded in bytes (``memo.BytesLRU``).
"""

from __future__ import annotations


import ctypes
import json
import sys
import time
from typing import Callable

import numpy as np

from tensorjob_jupyter.inference.base import (
    Constraint, ConstraintError, ModelError,
)
from tensorjob_jupyter.inference.grammar_stacks import (
    GrammarStacks, GrammarSyntaxError, GrammarTooCostly, ParsedGrammar,
)
from tensorjob_jupyter.inference.library import TESTED_LLAMA_CPP, CaptureLog, llama_cpp_library, log_reason
from tensorjob_jupyter.inference.memo import BytesLRU
from tensorjob_jupyter.inference.pattern import PatternBudget, PatternError, automaton_rules, pattern_automaton


# -- constrained decoding ------------------------------------------------------------------------

#: Free text, for ``Constraint.free_text``: it may not begin with whitespace or ``{`` (a tool call does).
FREE_TEXT_RULES = ('tj-free-text ::= [^{ \\t\\r\\n] tj-any-char*\n'
                   'tj-any-char ::= [\\x01-\\U0010FFFF]')
#: A character of a JSON string: no quote, backslash or control character unless escaped.
JSON_CHAR_RULE = (r'char ::= [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] '
                  r'[0-9a-fA-F])')
#: The largest grammar accepted: llama.cpp's parser and sampler work in time and memory that grow with it.
MAX_GRAMMAR_CHARS = 256 * 1024
#: The most parser stacks llama.cpp's grammar may carry (a 1,024-value enum needs 1,025 where it begins).
MAX_GRAMMAR_STACKS = 2048
#: The most stack expansions (llama_grammar_advance_stack steps) one token may take.
MAX_GRAMMAR_WORK = 50_000
#: The most time the grammar may take for one token, full-vocabulary pass included.
MAX_GRAMMAR_SECONDS = 2.0
#: What one chunk of the full-vocabulary pass should cost: how soon an abandoned request is seen.
CHUNK_TARGET_S = 0.02
#: The bytes kept of schemas' grammars, and of grammars' parsed rules, between requests.
GRAMMAR_MEMO_BYTES = 16 * 1024 * 1024
PARSED_MEMO_BYTES = 16 * 1024 * 1024

_grammars = BytesLRU(GRAMMAR_MEMO_BYTES)
_parsed = BytesLRU(PARSED_MEMO_BYTES)
_converter_class = None


class Abandoned(Exception):
    """The request's job has ended: the engine stops generating for it at once (``cancelled``)."""


def _converter():
    """llama-cpp-python's converter, with patterns made deterministic automata (``pattern.py``)."""
    global _converter_class
    if _converter_class is None:
        llama_cpp_library()
        from llama_cpp.llama_grammar import SchemaConverter

        class PatternConverter(SchemaConverter):
            def __init__(self, **kwargs):
                super().__init__(**kwargs)
                self._tj_patterns = 0
                self._tj_budget = PatternBudget()

            def _visit_pattern(self, pattern, name):
                automaton = pattern_automaton(pattern, self._tj_budget)
                start, rules = automaton_rules(automaton, f"tj-pattern-{self._tj_patterns}")
                self._tj_patterns += 1
                for rule_name, body in rules.items():
                    self._rules[rule_name] = body
                return self._add_rule(name, f'"\\"" {start} "\\"" space')

        _converter_class = PatternConverter
    return _converter_class


def constraint_grammar(schema: str, free_text: bool = False) -> str:
    """The GBNF grammar for output matching the JSON Schema ``schema`` (JSON text), through
    llama-cpp-python's converter; with ``free_text``, or plain text instead. ``ConstraintError``
    names what the converter cannot handle. Kept between requests in a memo bounded in bytes."""
    return _grammars.get_or_make((schema, free_text), lambda: _make_grammar(schema, free_text),
                                 lambda grammar: sys.getsizeof(schema) + sys.getsizeof(grammar))


def _make_grammar(schema: str, free_text: bool) -> str:
    try:
        value = json.loads(schema)
        converter = _converter()(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
        value = converter.resolve_refs(value, "schema")
        top = converter.visit(value, "tj-output")
        rules = converter.format_grammar()
    except RecursionError:
        raise ConstraintError("the JSON schema is nested too deeply to turn into a grammar") from None
    except PatternError as e:
        raise ConstraintError(f"the JSON schema's pattern cannot be turned into a grammar: {e}") from None
    except Exception as e:  # noqa: BLE001 - the converter asserts and raises all sorts
        detail = " ".join(str(e).split())[:300] or type(e).__name__
        raise ConstraintError(f"the JSON schema cannot be turned into a grammar: {detail}") from None
    # llama-cpp-python's converter lets a JSON string hold raw control characters, which JSON forbids
    # (llama.cpp's own converter does not): hold string characters to what JSON allows.
    rules = "\n".join(JSON_CHAR_RULE if line.startswith("char ::= ") else line for line in rules.split("\n"))
    root = f"root ::= {top} | tj-free-text\n{FREE_TEXT_RULES}" if free_text else f"root ::= {top}"
    grammar = f"{rules}\n{root}\n"
    if len(grammar) > MAX_GRAMMAR_CHARS:
        raise ConstraintError(f"the JSON schema makes a grammar of {len(grammar)} characters, over the "
                              f"{MAX_GRAMMAR_CHARS} this host accepts; simplify it (fewer alternatives, smaller "
                              f"maxItems and maxLength)")
    return grammar


def parsed_grammar(gbnf: str) -> ParsedGrammar:
    """The grammar's rules as llama.cpp lays them out (``grammar_stacks``), kept in a memo bounded in bytes."""
    return _parsed.get_or_make(gbnf, lambda: ParsedGrammar(gbnf), lambda parsed: sys.getsizeof(gbnf) + parsed.nbytes)


def grammar_stacks(gbnf: str) -> GrammarStacks:
    """The stacks llama.cpp will hold for ``gbnf``, counted within this module's bounds; ``ConstraintError``
    if even its start is past them. ``GrammarSyntaxError`` if the model of llama.cpp's parser cannot read it."""
    try:
        return GrammarStacks(parsed_grammar(gbnf), max_stacks=MAX_GRAMMAR_STACKS, max_work=MAX_GRAMMAR_WORK)
    except GrammarTooCostly as e:
        raise ConstraintError(f"the JSON schema makes a grammar too costly for the shared model: {e}") from None


#: The bytes a UTF-8 lead byte may be followed by first (the rest: 80-BF); others, 80-BF.
_SECOND_BYTE = {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF), 0xF4: (0x80, 0x8F)}
_CONTINUATION = (0x80, 0xBF)
_COMPLETE = (0, 0, 0)  # no character in progress


class Utf8Table:
    """Which tokens keep a byte stream valid UTF-8, whatever character is in progress.

    llama.cpp's grammar decodes UTF-8 leniently across tokens (a lead byte
    followed by an ASCII byte passes as one odd character), so text it
    accepts could still hold invalid UTF-8 -- which the text stream turns into
    U+FFFD and a JSON string's length or a pattern then no longer holds. The
    grammar sampler also masks every token that would break UTF-8. A state is
    ``(bytes still needed, lowest, highest allowed next byte)``; a mask per
    state is computed from per-token arrays on first use.
    """

    def __init__(self, pieces: list[bytes]):
        n = len(pieces)
        self.length = np.zeros(n, np.int32)
        self.first = np.zeros(n, np.int32)
        self.lead_cont = np.zeros(n, np.int32)  # leading continuation bytes
        self.rest_valid = np.zeros(n, bool)  # the bytes after them decode (maybe ending mid-character)
        self.tail: list[tuple[int, int, int]] = [_COMPLETE] * n  # the state a token leaves when it starts afresh
        import codecs

        decoder_class = codecs.getincrementaldecoder("utf-8")
        for t, data in enumerate(pieces):
            self.length[t] = len(data)
            self.first[t] = data[0] if data else -1
            k = 0
            while k < len(data) and 0x80 <= data[k] <= 0xBF:
                k += 1
            self.lead_cont[t] = k
            decoder = decoder_class("strict")
            try:
                decoder.decode(data[k:], final=False)
            except UnicodeDecodeError:
                continue
            self.rest_valid[t] = True
            pending = decoder.getstate()[0]
            if pending:
                lead = pending[0]
                size = 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
                low, high = _SECOND_BYTE.get(lead, _CONTINUATION) if len(pending) == 1 else _CONTINUATION
                self.tail[t] = (size - len(pending), low, high)
        self._masks: dict[tuple[int, int, int], np.ndarray] = {}
        # a token of each single byte, where the vocabulary has one: asking the grammar about it says
        # whether any token beginning with that byte can be allowed
        single = np.flatnonzero(self.length == 1)
        self.probe = np.full(256, -1, np.int32)
        self.probe[self.first[single][::-1]] = single[::-1]  # the lowest id of each byte
        self.has_probe = self.probe >= 0

    def mask(self, state: tuple[int, int, int]) -> np.ndarray:
        """The tokens allowed in ``state`` (a boolean array over the vocabulary)."""
        m = self._masks.get(state)
        if m is None:
            need, low, high = state
            if need == 0:
                m = (self.lead_cont == 0) & self.rest_valid
            else:
                fits = (self.length >= 1) & (self.first >= low) & (self.first <= high)
                short = (self.length <= need) & (self.lead_cont == self.length)
                long = (self.length > need) & (self.lead_cont == need) & self.rest_valid
                m = fits & (short | long)
            self._masks[state] = m
        return m

    def allowed(self, state: tuple[int, int, int], token: int) -> bool:
        return bool(self.mask(state)[token])

    def after(self, state: tuple[int, int, int], token: int) -> tuple[int, int, int]:
        need = state[0]
        length = int(self.length[token])
        if need and length <= need:
            return (need - length, *_CONTINUATION) if need > length else _COMPLETE
        return self.tail[token]


#: With greedy decoding, how many of the likeliest tokens are checked one by one before the grammar
#: is applied to the whole vocabulary.
TOP_CANDIDATES = 32


class GrammarSampler:
    """A request's sampler chain, with its output held to a grammar, within bounds.

    llama.cpp's grammar sampler checks every candidate token against the
    grammar, about as long as a decode step of a small model. Most tokens of
    a structured answer are ones the grammar allows anyway, so each token is
    first chosen by the chain alone and then checked alone; only when the
    grammar rejects it is the choice made again over the whole vocabulary,
    grammar first (as llama.cpp's own ``common_sampler`` does). With greedy
    decoding the next few likeliest tokens are checked alone first, which
    nearly always finds the answer. Greedy decoding picks the same token
    either way: the best one the grammar allows. A token the grammar rejected is never accepted into it (that
    aborts in C++), and a grammar that allows no token at all is an error.

    The whole-vocabulary pass asks the grammar first about one single-byte
    token per byte and then only about the tokens whose first byte it can
    take, in chunks of about ``CHUNK_TARGET_S``; between chunks it raises
    ``Abandoned`` once ``abandoned()`` says the request's job has ended, and
    ``ConstraintError`` once the token has taken ``MAX_GRAMMAR_SECONDS``.
    Before llama.cpp accepts a token, ``GrammarStacks`` accepts it (see the
    module's docstring): the grammar's stacks never pass their bounds.

    With ``free_text`` the grammar binds only an output whose first token
    begins with ``{``; any other first token releases it.
    """

    #: Check the free choice first (False: always grammar first, as llama.cpp's own sampler does; for tests).
    check_first = True

    def __init__(self, engine, chain, constraint: Constraint, greedy: bool = False,
                 abandoned: Callable[[], bool] | None = None):
        self._lc = lc = engine._lc
        self._engine = engine
        self._chain = chain
        self._chain_ptr = getattr(chain, "sampler", None)
        if self._chain_ptr is None:
            raise ModelError("llama-cpp-python's LlamaSampler has no `sampler` pointer; constrained decoding "
                             f"is tested with llama-cpp-python {TESTED_LLAMA_CPP}")
        self._free_text = constraint.free_text
        self._greedy = greedy
        self._abandoned = abandoned or (lambda: False)
        self._first = True
        self.grammar_checks = 0  # tokens checked alone
        self.grammar_full = 0  # tokens chosen again over the whole vocabulary
        self.slowest_token_s = 0.0  # the most grammar time one token took
        self._grammar = None
        gbnf = engine.grammar(constraint)
        try:
            self.stacks = grammar_stacks(gbnf)  # before llama.cpp expands anything: ConstraintError past the bounds
        except GrammarSyntaxError as e:  # llama.cpp says why (its parser stops before expanding anything)
            self.stacks = None
            unreadable = str(e)
        with CaptureLog() as lines:
            ptr = lc.llama_sampler_init_grammar(engine._vocab, gbnf.encode("utf-8"), b"root")
        if not ptr:
            raise ConstraintError(f"llama.cpp refused the grammar made from the JSON schema: "
                                  f"{log_reason(lines) or 'it does not parse'}")
        if self.stacks is None:  # llama.cpp reads what the model of it cannot: its cost cannot be bounded
            lc.llama_sampler_free(ptr)
            raise ConstraintError(f"the grammar made from the JSON schema cannot be measured before use "
                                  f"({unreadable}); this host does not run it")
        self._grammar = ptr
        self._utf8 = engine.utf8_table()
        self._utf8_state = _COMPLETE
        n = engine.n_vocab
        self._n = n
        self._ids = np.arange(n, dtype=np.int32)
        dtype = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])
        assert dtype.itemsize == ctypes.sizeof(lc.llama_token_data)
        self._buf = np.zeros(n, dtype=dtype)
        self._one = np.zeros(1, dtype=dtype)
        self._part = np.zeros(n, dtype=dtype)  # the candidates of a whole-vocabulary pass, chunk by chunk
        self._data_p = ctypes.POINTER(lc.llama_token_data)
        self._buf_p = self._buf.ctypes.data_as(self._data_p)
        self._one_p = self._one.ctypes.data_as(self._data_p)
        self._part_at = self._part.ctypes.data
        self._arr = lc.llama_token_data_array()
        self._one_arr = lc.llama_token_data_array()
        self._part_arr = lc.llama_token_data_array()
        self._chunk = 1024
        self._token_started = 0.0

    def _fill(self, logits) -> None:
        buf = self._buf
        buf["id"] = self._ids
        buf["logit"] = logits
        buf["p"] = 0.0
        arr = self._arr
        arr.data, arr.size, arr.selected, arr.sorted = self._buf_p, self._n, -1, False

    def _choose(self, first) -> tuple[int, float]:
        """Apply ``first`` (a sampler or None) then the chain to the filled array: (token, its logit)."""
        lc, arr = self._lc, self._arr
        ref = ctypes.byref(arr)
        if first is not None:
            lc.llama_sampler_apply(first, ref)
        lc.llama_sampler_apply(self._chain_ptr, ref)
        if not 0 <= arr.selected < arr.size:
            raise ModelError("the sampler chose no token")
        chosen = arr.data[arr.selected]
        return int(chosen.id), float(chosen.logit)

    def _best_allowed(self, utf8: np.ndarray) -> int | None:
        """Greedy decoding: the likeliest of the ``TOP_CANDIDATES`` likeliest tokens (after the chain's
        penalties) that the grammar and UTF-8 allow, checked one by one; None if none is."""
        logits = self._buf["logit"]  # penalised in place by the chain, still in token order
        k = min(TOP_CANDIDATES, self._n - 1)
        top = np.argpartition(-logits, k)[:k]
        for t in top[np.lexsort((top, -logits[top]))]:  # best first; the lower id first on a tie, as greedy does
            if not np.isfinite(logits[t]):
                break
            if utf8[t] and self._allowed(int(t)):
                return int(t)
        return None

    def _allowed(self, token: int) -> bool:
        one = self._one
        one[0] = (token, 0.0, 0.0)
        arr = self._one_arr
        arr.data, arr.size, arr.selected, arr.sorted = self._one_p, 1, -1, False
        self._lc.llama_sampler_apply(self._grammar, ctypes.byref(arr))
        return bool(np.isfinite(one["logit"][0]))

    def _grammar_allows(self, ids: np.ndarray) -> np.ndarray:
        """Which of ``ids`` the grammar allows, asked in chunks of about ``CHUNK_TARGET_S`` each; between
        chunks, ``Abandoned`` if the request's job has ended and ``ConstraintError`` past the token's time."""
        part, arr, lc = self._part, self._part_arr, self._lc
        count = len(ids)
        part["id"][:count] = ids
        part["logit"][:count] = 0.0
        itemsize = part.itemsize
        at = 0
        while at < count:
            if self._abandoned():
                raise Abandoned()
            spent = time.perf_counter() - self._token_started
            if spent > MAX_GRAMMAR_SECONDS:
                raise ConstraintError(f"the grammar made from the JSON schema took more than {MAX_GRAMMAR_SECONDS} s "
                                      f"of the shared model for one token ({self.stacks.count} parser stacks); "
                                      f"simplify the schema (fewer alternatives that begin alike)")
            size = min(self._chunk, count - at)
            arr.data = ctypes.cast(self._part_at + at * itemsize, self._data_p)
            arr.size, arr.selected, arr.sorted = size, -1, False
            started = time.perf_counter()
            lc.llama_sampler_apply(self._grammar, ctypes.byref(arr))
            took = time.perf_counter() - started
            at += size
            # the next chunk: about CHUNK_TARGET_S at what this one cost per token
            self._chunk = int(min(max(size * CHUNK_TARGET_S / max(took, 1e-6), 16), self._n))
        return np.isfinite(part["logit"][:count])

    def _choose_constrained(self, logits, utf8: np.ndarray) -> int:
        """The chain's choice over the whole vocabulary, among the tokens the grammar and UTF-8 allow."""
        table = self._utf8
        candidates = utf8.copy()
        if self._utf8_state == _COMPLETE:
            # a token can be allowed only if its first byte can: ask about one single-byte token per byte
            probe_bytes = np.flatnonzero(table.has_probe)
            byte_ok = np.ones(256, bool)
            byte_ok[probe_bytes] = self._grammar_allows(table.probe[probe_bytes])
            starts = table.first
            candidates &= (starts < 0) | byte_ok[np.clip(starts, 0, 255)]
        ids = np.flatnonzero(candidates).astype(np.int32)
        allowed = np.zeros(self._n, bool)
        allowed[ids[self._grammar_allows(ids)]] = True
        self._fill(logits)
        self._buf["logit"][~allowed] = -np.inf
        token, logit = self._choose(None)
        if not np.isfinite(logit):
            raise ConstraintError("the grammar allows no token here (the model cannot go on)")
        return token

    def sample(self, ctx, idx: int) -> int:
        """The next token, from the logits of batch row ``idx`` of the llama.cpp context ``ctx``."""
        return self.sample_logits(np.ctypeslib.as_array(self._lc.llama_get_logits_ith(ctx.ctx, idx),
                                                        shape=(self._n,)))

    def sample_logits(self, logits: np.ndarray) -> int:
        """The next token from ``logits`` (one float per vocabulary entry), accepted into the grammar."""
        lc = self._lc
        token = None
        if self._grammar is None or self.check_first:
            self._fill(logits)
            token, _ = self._choose(None)
        if self._grammar is not None:
            self._token_started = time.perf_counter()
            self.grammar_checks += 1
            utf8 = self._utf8.mask(self._utf8_state)
            if token is not None and not (utf8[token] and self._allowed(token)):
                token = self._best_allowed(utf8) if self._greedy else None
            if token is None:
                self.grammar_full += 1
                token = self._choose_constrained(logits, utf8)
            if not self._engine.is_eog(token):  # the sequence ends at an end token: nothing to accept
                piece = self._engine.piece(token)
                try:
                    self.stacks.accept(piece)  # counted first: llama.cpp never takes a step past the bounds
                except GrammarTooCostly as e:
                    raise ConstraintError(f"the JSON schema makes a grammar too costly for the shared model: "
                                          f"{e}") from None
                lc.llama_sampler_accept(self._grammar, token)
                self._utf8_state = self._utf8.after(self._utf8_state, token)
            self.slowest_token_s = max(self.slowest_token_s, time.perf_counter() - self._token_started)
            if self._first and self._free_text and not self._engine.piece(token).startswith(b"{"):
                self._release_grammar()  # free text: the grammar has done its work
        self._first = False
        lc.llama_sampler_accept(self._chain_ptr, token)
        return token

    def _release_grammar(self) -> None:
        grammar, self._grammar = self._grammar, None
        if grammar is not None:
            self._lc.llama_sampler_free(grammar)

    def close(self) -> None:
        self._release_grammar()
        chain, self._chain = self._chain, None
        if chain is not None:
            chain.close()
