"""Constrained decoding on llguidance: a constraint becomes a grammar, and the sampler holds each token to it.

A request's ``Constraint`` -- a JSON Schema, a regex, a list of choices or a Lark grammar --
becomes an llguidance grammar (``grammar_of``), and ``GrammarSampler`` holds each token to it,
computing the mask only when the sampler's own choice is refused. The grammar runs beside every
other request of the shared model, so what it may cost is bounded in size, in work (``LIMITS``)
and in CPU time (``MASK_CPU_LIMIT_S``), and a grammar past a bound fails its own request alone
(``ConstraintError``). ``check`` and ``matches`` run the same grammars without a model, so the
local sampler and the check of a served model's answer share one meaning of every grammar.

Design: docs/internals/inference.md#grammarpy
"""

from __future__ import annotations

import ctypes
import json
import queue
import re
import sys
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Callable

import llguidance
import numpy as np

from tensorjob_jupyter.inference.base import Constraint, ConstraintError, ModelError
from tensorjob_jupyter.inference.library import llama_cpp_library
from tensorjob_jupyter.inference.memo import BytesLRU
from tensorjob_jupyter.inference.greedy import greedy_token
from tensorjob_jupyter.inference.penalties import RepeatPenalty

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # declared in the stub only

#: llguidance's bounds on one grammar (its documented speeds: lexer fuel ~14k/ms, items ~20k/ms, a lexer state
#: 1-2 KB): a token's mask costs at most a few ms, a grammar's lexer at most ~20 MB.
LIMITS = llguidance.LLParserLimits(
    max_items_in_row=2000, initial_lexer_fuel=1_000_000, step_lexer_fuel=200_000, step_max_items=50_000,
    max_lexer_states=10_000, max_grammar_size=200_000, verbose_errors=False)
#: The CPU one token's mask may take (real schemas' take under 2 ms; an ambiguous grammar's grow past this).
MASK_CPU_LIMIT_S = 0.25
#: How JSON is written under a schema: one space after ``:`` and ``,``, nowhere else (what models write,
#: and no room to pad an answer with whitespace); guest schemas cannot loosen it (``x-guidance`` is overridden).
JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", ",
                                    "lenient": False, "coerce_one_of": False}
#: Free text beside a tool call (``Constraint.free_text``): it may not begin with whitespace or ``{``.
FREE_TEXT_RULE = r"text: /[^{ \t\r\n][\s\S]*/"
#: The stack of the thread every compile runs on (virtual memory: only what is touched is used).
COMPILE_STACK_BYTES = 256 * 1024 * 1024
#: Grammars kept between requests, in serialised form (bytes of their text) and compiled (by count:
#: a compiled grammar's lexer grows as it is used, up to ``LIMITS``).
GRAMMAR_MEMO_BYTES = 16 * 1024 * 1024
COMPILED_MEMO = 8

GRAMMARS = BytesLRU(GRAMMAR_MEMO_BYTES)

# A date Python's calendar accepts: years 0001-9999, the 29th of February in leap years only.
_YEAR = r"(?:[0-9]{3}[1-9]|[0-9]{2}[1-9][0-9]|[0-9][1-9][0-9]{2}|[1-9][0-9]{3})"
_LEAP_YEAR = r"(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_DATE = (rf"(?:{_YEAR}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
         rf"|02-(?:0[1-9]|1[0-9]|2[0-8]))|{_LEAP_YEAR}-02-29)")
# RFC 3339's time as rfc3339-validator (jsonschema's date-time and time check) reads it: no leap second.
_TIME = (r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]+)?"
         r"(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])")
#: Formats whose answers are also held to a pattern: exactly what ``jsonschema``'s checker of each accepts.
EXACT_FORMATS = {"date": f"^{_DATE}$", "date-time": f"^{_DATE}[Tt]{_TIME}$", "time": f"^{_TIME}$"}
#: Keywords whose values are data, and keywords whose values map names to schemas (as ``host/schemas.py``).
DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples"})
_NAMED_SCHEMAS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})


class Abandoned(Exception):
    """The request's job has ended: the engine stops generating for it at once (``cancelled``)."""


# -- a constraint as a grammar ------------------------------------------------------------------------


def grammar_of(constraint: Constraint) -> str:
    """llguidance's serialised grammar for ``constraint`` (kept between requests, bounded in bytes).
    Builds text only; ``check`` says whether it compiles."""
    return GRAMMARS.get_or_make(constraint, lambda: _make_grammar(constraint),
                                 lambda grammar: 2 * sys.getsizeof(grammar))


def _make_grammar(c: Constraint) -> str:
    G = llguidance.LLMatcher
    if c.schema is not None:  # c.kind, field by field: json, regex, choices, lark
        schema = json.loads(c.schema)
        if not isinstance(schema, dict):  # true/false schemas: llguidance takes objects
            schema = {} if schema else {"not": {}}
        _as_answers_are_held(schema)
        if c.free_text:
            schema = {**schema, "x-guidance": JSON_OPTIONS}
            return G.grammar_from_lark(f"start: call | text\ncall: %json {json.dumps(schema)}\n{FREE_TEXT_RULE}\n")
        try:
            return G.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)
        except ValueError as e:
            raise ConstraintError(f"the JSON schema cannot be turned into a grammar: {_one_line(e)}") from None
    if c.regex is not None:
        return G.grammar_from_regex(c.regex)
    if c.choices is not None:
        return G.grammar_from_lark("start: " + " | ".join(lark_string(s) for s in c.choices))
    assert c.lark is not None, "a Constraint holds exactly one of schema, regex, choices and lark"
    return G.grammar_from_lark(c.lark)


def lark_string(text: str) -> str:
    """``text`` as a Lark string literal, which takes JSON's escapes -- and refuses a raw DEL (U+007F), the one
    character JSON leaves unescaped that llguidance's Lark lexer does not take (so it is escaped too)."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _as_answers_are_held(schema: dict) -> None:
    """``schema`` (in place) as the grammar holds answers to it (both still valid against the guest's schema):

    * every subschema whose ``format`` is in ``EXACT_FORMATS`` gets that format's pattern -- its own
      ``pattern`` when it has none, else one more ``allOf`` entry;
    * every object schema that names its ``properties`` and says nothing of others gets no others
      (``additionalProperties: false``), as OpenAI's strict mode and llama.cpp's converter hold them: a small
      model otherwise goes on inventing keys until its token limit. Not where ``allOf`` could be splitting an
      object's properties between schemas (anywhere in the schema), nor beside ``patternProperties``.

    Iterative (a schema may be nested deeper than Python's recursion limit); data (``enum``, ``const``...) is
    not walked."""
    close_objects = '"allOf"' not in json.dumps(schema) and '"unevaluatedProperties"' not in json.dumps(schema)
    stack: list = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        for key, value in node.items():
            if key in DATA_KEYWORDS:
                continue
            if key in _NAMED_SCHEMAS and isinstance(value, dict):
                stack.extend(value.values())
            else:
                stack.append(value)
        if (close_objects and isinstance(node.get("properties"), dict) and "additionalProperties" not in node
                and "patternProperties" not in node):
            node["additionalProperties"] = False
        fmt = node.get("format")
        exact = EXACT_FORMATS.get(fmt) if isinstance(fmt, str) else None
        if exact is None:
            continue
        if "pattern" not in node:
            node["pattern"] = exact
        elif isinstance(node.get("allOf", []), list):
            node["allOf"] = [*node.get("allOf", []), {"pattern": exact}]


def check(constraint: Constraint) -> None:
    """``ConstraintError`` (one line, naming what llguidance cannot enforce) unless ``constraint`` compiles.
    Bounded work: the constraint's size is capped where it arrives, the compile by ``LIMITS``."""
    grammar = grammar_of(constraint)
    message = _compiler.run(lambda: llguidance.LLMatcher.validate_grammar(grammar, None, limits=LIMITS))
    if message:
        raise ConstraintError(f"{_KIND_WORDS[constraint.kind]} cannot be enforced: {_one_line(message)}")


def matches(constraint: Constraint, text: str) -> bool:
    """Whether ``text`` is a whole answer the grammar allows (its bytes through the same grammar)."""
    matcher = _compiler.run(lambda: llguidance.LLMatcher(_byte_tokenizer(), grammar_of(constraint), log_level=0,
                                                         limits=LIMITS))
    if matcher.is_error():
        return False
    data = text.encode("utf-8")
    return matcher.try_consume_tokens(list(data)) == len(data) and matcher.is_accepting()


def allows_prefix(constraint: Constraint, data: bytes) -> bool:
    """Whether ``data`` can begin an answer the grammar allows (an answer cut short: ``matches`` once whole)."""
    matcher = _compiler.run(lambda: llguidance.LLMatcher(_byte_tokenizer(), grammar_of(constraint), log_level=0,
                                                         limits=LIMITS))
    return not matcher.is_error() and matcher.try_consume_tokens(list(data)) == len(data) and not matcher.is_error()


_KIND_WORDS = {"json": "the JSON schema", "regex": "the regex", "choices": "the choices", "lark": "the Lark grammar"}


#: llguidance's names for its bounds (``LIMITS``), which no guest can change: a message that names one says
#: instead what the guest can.
_BOUND_WORDS = re.compile(r"initial_lexer_fuel|step_lexer_fuel|step_max_items|max_items_in_row|max_lexer_states|"
                          r"max_grammar_size|precompute_large_lexemes|fuel|too many", re.I)
_TOO_COSTLY = ("the grammar needs more work for one token than its bounds allow: make it less ambiguous (rules "
               "that can split the same text many ways, repetitions nested in repetitions) or smaller")


def _one_line(message: Any) -> str:
    """llguidance's message on one line, without its ``<non-verbose/>`` marker; one that names a setting of the
    engine (fixed here) says what to change in the grammar instead."""
    text = " ".join(str(message).replace("<non-verbose/>", " ").split())
    if _BOUND_WORDS.search(text):
        return f"{_TOO_COSTLY} (llguidance: {text[:200]})"
    return text[:400]


class _Bytes:
    """A vocabulary of the 256 bytes and an end token: text checked byte by byte."""

    eos_token_id = 256
    bos_token_id = None
    tokens = [bytes([i]) for i in range(256)] + [b"\xff<end>"]
    special_token_ids = [256]

    def __call__(self, text) -> list[int]:
        return list(text if isinstance(text, bytes) else text.encode("utf-8"))


_byte_tokenizer_value = None


def _byte_tokenizer() -> llguidance.LLTokenizer:
    global _byte_tokenizer_value
    if _byte_tokenizer_value is None:
        _byte_tokenizer_value = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes()), slices=[])
    return _byte_tokenizer_value


# -- where grammars are compiled --------------------------------------------------------------------


class _Compiler:
    """One daemon thread with a ``COMPILE_STACK_BYTES`` stack that runs every llguidance compile."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def run(self, fn: Callable[[], Any]) -> Any:
        if threading.current_thread() is self._thread:
            return fn()
        self._start()
        done: Future = Future()
        self._jobs.put((fn, done))
        return done.result()

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            before = threading.stack_size(COMPILE_STACK_BYTES)
            try:
                self._thread = threading.Thread(target=self._loop, name="tensorjob-grammar-compile", daemon=True)
                self._thread.start()
            finally:
                threading.stack_size(before)

    def _loop(self) -> None:
        while True:
            fn, done = self._jobs.get()
            if not done.set_running_or_notify_cancel():
                continue
            try:
                done.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                done.set_exception(e)


_compiler = _Compiler()


# -- the model's side --------------------------------------------------------------------------------


#: Texts llama.cpp's tokenizer must give back byte for byte (``ModelGrammars``): spaces, which a SentencePiece
#: vocabulary writes as U+2581, and the separators a JSON answer is made of.
ROUND_TRIP_PROBES = (" ", "  ", ": ", ", ", "a b", " {", '" ', "\n", "\t", "x\n y", "é è", "\u00a0")


class ModelGrammars:
    """One model's vocabulary as llguidance sees it, and its compiled grammars (the last ``COMPILED_MEMO``).

    Built on the first constrained request (every token's bytes read, then llguidance's tokenizer: about a
    quarter of a second for a 50,000-token vocabulary), on the model's thread, which owns the vocabulary.

    The mask is exact only if llguidance reads each token as the bytes the engine writes into the answer
    (``engine.piece``): a token that writes nothing there -- a control token, and the unknown token, which
    ``llguidance.llamacpp`` would read as the text ``<unk>`` and allow inside any string, so an answer came out
    five characters short of its ``minLength`` -- is read as a special token (its name behind a 0xFF byte), which
    no grammar allows as text (``_vocabulary_bytes``).

    llguidance also asks the tokenizer for the tokens of text the grammar forces, and holds the model to them;
    they must spell that text exactly. llama.cpp's own tokenizer does for real vocabularies, but a
    SentencePiece vocabulary without a ``▁`` token spells a space as the three bytes of ``▁`` (its byte
    fallback), and the grammar then refuses the very token its mask allowed. So the tokenizer is probed
    (``ROUND_TRIP_PROBES``): when llama.cpp's does not give every probe back, tokenizing goes through
    ``_SpelledTokenizer``, which keeps llama.cpp's tokens where they spell the text and spells it from the
    vocabulary's own pieces where they do not."""

    def __init__(self, engine) -> None:
        lc = llama_cpp_library()
        tokens, eog = _vocabulary_bytes(engine)
        tokenize = ctypes.cast(lc.llama_cpp._lib.llama_tokenize, ctypes.c_void_p).value
        native = llguidance.LLTokenizer.from_llamacpp(  # type: ignore[attr-defined]  # not in llguidance's stub
            tokens=tokens, vocab_ptr=engine._vocab, tokenize_fptr=tokenize, eos_token=eog or None, slices=None)
        if all(_spells(tokens, native.tokenize_str(text), text.encode("utf-8")) for text in ROUND_TRIP_PROBES):
            self.tokenizer = native
        else:
            spelled = _SpelledTokenizer(tokens, native, eog[0] if eog else engine.n_vocab - 1)
            self.tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(spelled), n_vocab=engine.n_vocab,
                                                    eos_token=eog or None)
        self._compiled: dict[str, llguidance.LLMatcher] = {}
        self._lock = threading.Lock()

    def matcher(self, constraint: Constraint, fresh: bool = False) -> llguidance.LLMatcher:
        """A matcher for ``constraint`` at its start; ``ConstraintError`` if it does not compile. It shares its
        lexer with the kept compiled grammar (``fresh``: compiled anew, replacing the kept one)."""
        grammar = grammar_of(constraint)
        with self._lock:
            template = self._compiled.pop(grammar, None)
        if fresh:
            template = None
        if template is None:
            template = _compiler.run(lambda: llguidance.LLMatcher(self.tokenizer, grammar, log_level=0,
                                                                  limits=LIMITS))
            if template.is_error():
                raise ConstraintError(f"{_KIND_WORDS[constraint.kind]} cannot be enforced: "
                                      f"{_one_line(template.get_error())}")
        with self._lock:
            self._compiled[grammar] = template  # the most recently used last
            while len(self._compiled) > COMPILED_MEMO:
                self._compiled.pop(next(iter(self._compiled)))
        return template.deep_copy()


def _vocabulary_bytes(engine) -> tuple[list[bytes], list[int]]:
    """Each token as llguidance is to read it, and the end-of-generation tokens. A token reads as the bytes the
    engine writes into the answer for it; one that writes none there (control tokens, the unknown token), and a
    user-defined one written like a control token (``<...>``, as ``llguidance.llamacpp`` reads those), is
    special: its name behind a 0xFF byte. One pass, and a token's name is asked for only where it may be
    special: this runs once a model, on the first constrained request, and is most of that request's setup."""
    lc, vocab = engine._lc, engine._vocab
    get_attr = getattr(lc, "llama_vocab_get_attr", None) or lc.llama_token_get_attr
    is_eog = lc.llama_vocab_is_eog
    may_be_special = lc.LLAMA_TOKEN_ATTR_CONTROL | lc.LLAMA_TOKEN_ATTR_USER_DEFINED
    buf = ctypes.create_string_buffer(16 * 1024)
    tokens, eog = [], []
    for t in range(engine.n_vocab):
        text = engine.piece(t)
        attr = get_attr(vocab, t)
        if is_eog(vocab, t):
            eog.append(t)
        if not text or attr & may_be_special:
            n = lc.llama_token_to_piece(vocab, t, buf, len(buf), 0, True)  # special tokens by their name
            name = buf.raw[:max(n, 0)]
            looks_special = attr & lc.LLAMA_TOKEN_ATTR_USER_DEFINED and name.startswith(b"<") and name.endswith(b">")
            if not text or attr & lc.LLAMA_TOKEN_ATTR_CONTROL or looks_special:
                text = b"\xff" + (name or b"<token %d>" % t)
        tokens.append(text)
    return tokens, eog


def _spells(tokens: list[bytes], ids: list[int], data: bytes) -> bool:
    return all(0 <= i < len(tokens) for i in ids) and b"".join(tokens[i] for i in ids) == data


class _SpelledTokenizer:
    """A tokenizer whose tokens always spell the text they were given: llama.cpp's, where its tokens do, else
    the longest pieces of the vocabulary, left to right (as llguidance's ``TokenizerWrapper`` takes it)."""

    def __init__(self, tokens: list[bytes], native: llguidance.LLTokenizer, eos: int) -> None:
        self.tokens = tokens
        self.eos_token_id = eos
        self.bos_token_id = None
        self.special_token_ids = [i for i, piece in enumerate(tokens) if piece.startswith(b"\xff")]
        self._native = native
        self._ids: dict[bytes, int] = {}
        for i, piece in enumerate(tokens):
            if piece and not piece.startswith(b"\xff"):
                self._ids.setdefault(piece, i)
        self._longest = max(map(len, self._ids), default=1)

    def __call__(self, text) -> list[int]:
        data = text if isinstance(text, bytes) else text.encode("utf-8")
        ids = self._native.tokenize_bytes(data)
        if _spells(self.tokens, ids, data):
            return ids
        out, i = [], 0
        while i < len(data):
            for n in range(min(self._longest, len(data) - i), 0, -1):
                token = self._ids.get(data[i:i + n])
                if token is not None:
                    out.append(token)
                    i += n
                    break
            else:
                return ids  # a byte no token holds: the vocabulary cannot spell it at all
        return out


class GrammarSampler:
    """A request's sampler chain, with its output held to a grammar.

    Each token is chosen by the chain (temperature, greedy or a seeded
    draw) over the whole vocabulary, after the repeat penalty (``penalty``,
    applied to the row first), then offered to the matcher;
    when the matcher refuses it, the token mask is computed, every token it
    excludes gets a logit of minus infinity, and the chain chooses again.
    A greedy chain (``greedy``) chooses on the row itself, the first of the
    largest logits (``greedy.greedy_token``: llama.cpp's greedy choice
    without its candidate array).
    The chain only ever accepts the token the grammar took. An end token is
    allowed only where the grammar is complete; where the grammar allows
    nothing more, the mask holds only the end token. A matcher that goes
    into its error state (a step past ``LIMITS``) is a ``ConstraintError``,
    and a grammar that allows no token at all is one too. ``abandoned()``
    is asked before each token: the engine ends a request whose job has
    ended (``Abandoned``).
    """

    #: Offer the chain's own choice first (False: always mask first; for tests).
    check_first = True

    def __init__(self, engine, chain, constraint: Constraint, greedy: bool = False,
                 abandoned: Callable[[], bool] | None = None, keep_mask: bool = False,
                 penalty: RepeatPenalty | None = None):
        self._lc = lc = engine._lc
        self._engine = engine
        self._chain = chain
        self._chain_ptr = getattr(chain, "sampler", None)
        if self._chain_ptr is None:
            raise ModelError("llama-cpp-python's LlamaSampler has no `sampler` pointer; constrained decoding "
                             "needs it")
        self._abandoned = abandoned or (lambda: False)
        self._constraint = constraint
        self._greedy = greedy
        #: the repeat penalty, applied to the row before the chain sees it (``penalties``), or None
        self._penalty = penalty
        #: compute every token's mask first and keep it in ``allowed`` (what the engine's logprobs read: a token
        #: the grammar forbids has probability 0); else only where the chain's own choice is refused
        self._keep_mask = keep_mask
        self.allowed: np.ndarray | None = None
        self._matcher = engine.grammars().matcher(constraint)
        #: the tokens the grammar has taken (replayed into a fresh compile: ``_renew``), and whether it was made
        self._taken: list[int] = []
        self._renewed = False
        #: tokens offered to the matcher, and those whose choice needed the whole mask
        self.grammar_checks = 0
        self.grammar_full = 0
        n = engine.n_vocab
        self._n = n
        self._ids = np.arange(n, dtype=np.int32)
        self._mask = np.zeros((1, (n + 31) // 32), dtype=np.int32)
        dtype = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])
        self._buf = np.zeros(n, dtype=dtype)
        self._data_p = ctypes.POINTER(lc.llama_token_data)
        self._arr = lc.llama_token_data_array()
        self._arr_ref = ctypes.byref(self._arr)
        self._buf_p = self._buf.ctypes.data_as(self._data_p)

    def _choose(self, logits: np.ndarray, allowed: np.ndarray | None = None) -> tuple[int, float]:
        """The chain's choice from ``logits`` (restricted to ``allowed``): (token, its logit after the chain). A
        greedy chain's is the row's first largest logit (``greedy.greedy_token``), without its candidate array."""
        if self._greedy:
            z = logits if allowed is None else np.where(allowed, logits, np.float32(-np.inf))
            token = greedy_token(z)
            return token, float(z[token])
        buf = self._buf
        buf["id"] = self._ids
        buf["p"] = 0.0
        buf["logit"] = logits
        if allowed is not None:
            buf["logit"][~allowed] = -np.inf
        arr = self._arr
        arr.data, arr.size, arr.selected, arr.sorted = self._buf_p, self._n, -1, False
        self._lc.llama_sampler_apply(self._chain_ptr, self._arr_ref)
        if not 0 <= arr.selected < arr.size:
            raise ModelError("the sampler chose no token")
        chosen = arr.data[arr.selected]
        return int(chosen.id), float(chosen.logit)

    def _renew(self) -> bool:
        """After an error of a matcher that may share its lexer with earlier requests: this request's own
        matcher, from a fresh compile, given again the tokens taken so far (once per request). False when it
        was renewed already, or the fresh one errs too (the request's own walk is past the bounds)."""
        if self._renewed:
            return False
        self._renewed = True
        matcher = self._engine.grammars().matcher(self._constraint, fresh=True)
        self._matcher = matcher
        return matcher.try_consume_tokens(self._taken) == len(self._taken) and not matcher.is_error()

    def _allowed(self) -> np.ndarray:
        """The tokens the grammar allows next (a boolean array over the vocabulary)."""
        self._compute_mask()
        if self._matcher.is_error() and self._renew():
            self._compute_mask()
        if self._matcher.is_error():
            raise ConstraintError(f"the grammar went past its bounds for one token: "
                                  f"{_one_line(self._matcher.get_error())}")
        return np.unpackbits(self._mask.view(np.uint8), bitorder="little")[:self._n].view(bool)  # 0/1: no copy

    def _compute_mask(self) -> None:
        """The matcher's mask into ``_mask``; ``ConstraintError`` when it took more than ``MASK_CPU_LIMIT_S``."""
        started = time.thread_time()
        self._matcher.unsafe_compute_mask_ptr(self._mask.ctypes.data, self._mask.nbytes)
        spent = time.thread_time() - started
        if spent > MASK_CPU_LIMIT_S:
            raise ConstraintError(f"one token's mask took {spent:.2f} s, past the bound of {MASK_CPU_LIMIT_S} s: "
                                  f"{_TOO_COSTLY}")

    def sample_logits(self, logits: np.ndarray) -> int:
        """The next token from ``logits`` (one float per vocabulary entry, this sampler's to change: the
        repeat penalty is applied to it in place), taken by the grammar."""
        if self._abandoned():
            raise Abandoned()
        if self._penalty is not None:
            self._penalty.apply(logits)
        self.grammar_checks += 1
        self.allowed = self._allowed() if self._keep_mask else None
        token = None
        if self.check_first:
            token, _ = self._choose(logits)
            if self._matcher.try_consume_tokens([token]) != 1:
                token = None  # refused (or past the bounds: ``_allowed`` says which)
        if token is None:
            self.grammar_full += 1
            token, logit = self._choose(logits, self.allowed if self.allowed is not None else self._allowed())
            if not np.isfinite(logit):
                raise ConstraintError("the grammar allows no token here (the model cannot go on)")
            if not self._matcher.consume_token(token):
                if self._matcher.is_error():  # taking it went past a bound (the parser's items, the lexer's states)
                    raise ConstraintError(f"the grammar went past its bounds for one token: "
                                          f"{_one_line(self._matcher.get_error())}")
                raise ConstraintError(f"the grammar refused a token its own mask allowed: "
                                      f"{_one_line(self._matcher.get_error())}")
        self._taken.append(token)
        self._lc.llama_sampler_accept(self._chain_ptr, token)
        if self._penalty is not None:
            self._penalty.accept(token)
        return token

    def close(self) -> None:
        self._matcher = None
        chain, self._chain = self._chain, None
        if chain is not None:
            chain.close()


__all__ = [
    "LIMITS", "MASK_CPU_LIMIT_S", "JSON_OPTIONS", "FREE_TEXT_RULE", "COMPILE_STACK_BYTES", "GRAMMAR_MEMO_BYTES",
    "COMPILED_MEMO", "GRAMMARS", "EXACT_FORMATS", "DATA_KEYWORDS", "Abandoned", "grammar_of", "lark_string",
    "check", "matches",
    "allows_prefix", "ROUND_TRIP_PROBES",
    "ModelGrammars", "GrammarSampler"
]
