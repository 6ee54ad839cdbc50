"""A guest's JSON Schema, checked and normalised: only what the grammar can enforce passes.

Every schema an ``infer`` carries (its ``format``, each tool's
``parameters``) is checked here before anything is built from it: that it is
a JSON Schema (``jsonschema``'s own meta-schema check), and that every keyword
in it is one the grammar can *enforce* (``WHY`` says why each other one is
refused, by name, with where it is in the schema). Host work on it is
bounded by size, depth, nodes, alternatives, enum values and repetition
bounds, and a ``pattern`` becomes an automaton (``inference/pattern.py``)
measured here, so a pattern that would be costly is refused before any
token. ``validator_for`` gives the validator an answer is checked with,
against the schema exactly as the guest gave it. ``structured.py`` builds an
infer's output spec from what passes.
"""

from __future__ import annotations

import copy
import json
import re
import sys
import threading
from typing import Any, Callable

from tensorjob_jupyter.inference.memo import BytesLRU
from tensorjob_jupyter.inference.pattern import MAX_PATTERN_DEPTH, PatternBudget, PatternError, pattern_automaton

#: Bounds on a guest's schemas: host work (checking, the grammar, llama.cpp's parse of it) stays small.
#: The whole of one infer's ``format`` and ``tools`` as compact JSON (non-ASCII escaped): what memory a schema
#: costs (its checked spec, its validator, its grammar, the events that report it) grows with this.
MAX_SCHEMA_BYTES = 128 * 1024
MAX_SCHEMA_DEPTH = 32
MAX_SCHEMA_NODES = 2000
MAX_ALTERNATIVES = 64
MAX_ENUM_VALUES = 1024
MAX_REPEAT = 256  # minItems / maxItems
MAX_LENGTH = 512  # minLength / maxLength (the converter nests a level per character; llama.cpp parses ~1000)
MAX_INT_RANGE = 256  # integer minimum..maximum becomes an enum of at most this many values
MAX_TOOLS = 64

ANNOTATIONS = frozenset({"$schema", "$id", "$comment", "title", "description", "default", "examples", "deprecated",
                         "readOnly", "writeOnly", "$defs", "definitions"})
TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
FORMATS = ("date", "time", "date-time", "uuid")
WHY = {
    "oneOf": "the grammar cannot make alternatives exclusive; use anyOf",
    "allOf": "the grammar cannot intersect schemas; merge them into one",
    "not": "the grammar cannot exclude a schema",
    "if": "the grammar cannot choose by condition", "then": "the grammar cannot choose by condition",
    "else": "the grammar cannot choose by condition",
    "exclusiveMinimum": "the grammar cannot bound numbers", "exclusiveMaximum": "the grammar cannot bound numbers",
    "multipleOf": "the grammar cannot restrict numbers to multiples",
    "uniqueItems": "the grammar cannot keep array items distinct",
    "patternProperties": "the grammar cannot match keys by pattern",
    "propertyNames": "the grammar cannot constrain keys",
    "minProperties": "the grammar cannot count properties", "maxProperties": "the grammar cannot count properties",
    "dependentRequired": "the grammar cannot make properties depend on each other",
    "dependentSchemas": "the grammar cannot make properties depend on each other",
    "dependencies": "the grammar cannot make properties depend on each other",
    "contains": "the grammar cannot require an item somewhere in an array",
    "minContains": "the grammar cannot count matching items", "maxContains": "the grammar cannot count matching items",
    "unevaluatedProperties": "the grammar cannot track evaluated properties",
    "unevaluatedItems": "the grammar cannot track evaluated items",
    "additionalItems": "use prefixItems alone", "$dynamicRef": "only local $ref is supported",
    "$recursiveRef": "only local $ref is supported", "$anchor": "only local $ref by JSON pointer is supported",
    "$dynamicAnchor": "only local $ref by JSON pointer is supported",
    "contentEncoding": "the grammar cannot check encoded content",
    "contentMediaType": "the grammar cannot check encoded content", "contentSchema": "the grammar cannot check encoded content",
}
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
#: The keywords that apply to each type (a keyword of another type is ignored by JSON Schema).
TYPE_KEYWORDS = {
    "object": {"properties", "required", "additionalProperties"},
    "array": {"items", "prefixItems", "minItems", "maxItems", "uniqueItems"},
    "string": {"minLength", "maxLength", "pattern", "format"},
    "integer": {"minimum", "maximum"}, "number": {"minimum", "maximum"}, "boolean": set(), "null": set(),
}
ALL_TYPE_KEYWORDS = set().union(*TYPE_KEYWORDS.values())
#: ``{}``: any JSON value.
ANY_VALUE = {"anyOf": [{"type": t} for t in ("string", "number", "boolean", "null", "object", "array")]}


class SchemaError(ValueError):
    """A schema the grammar cannot enforce, or output that does not match: ``schema_validation_failed``."""


# --- checking and normalising one schema ----------------------------------------------------


def _pointer(path: list) -> str:
    return "#" + "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


class Normaliser:
    """Checks one guest schema keyword by keyword and rewrites it into what the converter handles.

    Local ``$ref``s are moved into ``$defs`` under names unique across every
    schema given to one ``Normaliser`` (the converter names rules by a
    reference's last segment, so two ``#/$defs/item`` of two tools would
    otherwise share one rule).
    """

    def __init__(self) -> None:
        self.defs: dict[str, Any] = {}
        self._refs: dict[tuple[int, str], str] = {}
        self._nodes = 0
        self._roots: list[Any] = []
        self._patterns: set[str] = set()  # checked already (each pattern's automaton is built once)
        self._pattern_budget = PatternBudget()  # shared by all the patterns of this infer

    def schema(self, value: Any, where: str) -> dict:
        """A normalised copy of the root schema ``value``; ``where`` names it in messages."""
        _check_is_json_schema(value, where)
        self._roots.append(value)
        return self._node(value, [], len(self._roots) - 1, where, 0)

    def _fail(self, where: str, path: list, message: str) -> SchemaError:
        return SchemaError(f"{where} at {_pointer(path)}: {message}")

    def _node(self, node: Any, path: list, root: int, where: str, depth: int) -> Any:
        self._nodes += 1
        if self._nodes > MAX_SCHEMA_NODES:
            raise self._fail(where, path, f"the schema has more than {MAX_SCHEMA_NODES} subschemas")
        if depth > MAX_SCHEMA_DEPTH:
            raise self._fail(where, path, f"the schema is nested more than {MAX_SCHEMA_DEPTH} levels deep")
        if node is True or (isinstance(node, dict) and not (set(node) - ANNOTATIONS)):
            return copy.deepcopy(ANY_VALUE)
        if node is False:
            raise self._fail(where, path, "a `false` schema matches nothing, so no output could be made")
        if not isinstance(node, dict):
            raise self._fail(where, path, "a schema must be an object")
        for key in node:
            if key in WHY and not (key == "uniqueItems" and node[key] is False):
                raise self._fail(where, path, f"`{key}` is not supported: {WHY[key]}")
        if "$ref" in node:
            return self._ref(node, path, root, where, depth)
        keys = set(node) - ANNOTATIONS
        out: dict[str, Any] = {}
        if "anyOf" in node:
            alternatives = node["anyOf"]
            if len(alternatives) > MAX_ALTERNATIVES:
                raise self._fail(where, path, f"anyOf has more than {MAX_ALTERNATIVES} alternatives")
            others = keys - {"anyOf"}
            if others:
                raise self._fail(where, path, f"`{sorted(others)[0]}` beside anyOf is not supported: put it "
                                              f"inside each alternative")
            return {"anyOf": [self._node(a, path + ["anyOf", i], root, where, depth + 1)
                              for i, a in enumerate(alternatives)]}
        types = node.get("type")
        if isinstance(types, list):
            if not types:
                raise self._fail(where, path, "an empty `type` list matches nothing")
            rest = {k: v for k, v in node.items() if k != "type"}
            if "enum" in rest or "const" in rest:
                return self._values(node, path, root, where)
            return {"anyOf": [self._node({**{k: v for k, v in rest.items()
                                             if k in TYPE_KEYWORDS[t] or k not in ALL_TYPE_KEYWORDS},
                                          "type": t}, path, root, where, depth + 1) for t in types]}
        if "enum" in node or "const" in node:
            return self._values(node, path, root, where)
        if types is None:
            types = _implied_type(node)
            if types is None:
                raise self._fail(where, path, "a schema without `type` must say what it is: give `type`")
        out["type"] = types
        check = {"object": self._object, "array": self._array, "string": self._string,
                 "integer": self._integer, "number": self._scalar, "boolean": self._scalar,
                 "null": self._scalar}[types]
        return check(node, out, path, root, where, depth)

    def _ref(self, node: dict, path: list, root: int, where: str, depth: int) -> dict:
        ref = node["$ref"]
        others = set(node) - ANNOTATIONS - {"$ref"}
        if others:
            raise self._fail(where, path, f"`{sorted(others)[0]}` beside $ref is not supported: move it into "
                                          f"the referenced schema")
        if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
            raise self._fail(where, path, f"only local references (#/...) are supported, not {str(ref)[:80]!r}")
        key = (root, ref)
        name = self._refs.get(key)
        if name is None:
            name = self._refs[key] = f"tj-ref-{len(self._refs)}"
            target: Any = self._roots[root]
            parts = [p.replace("~1", "/").replace("~0", "~") for p in ref[2:].split("/")] if ref != "#" else []
            for part in parts:
                if isinstance(target, dict) and part in target:
                    target = target[part]
                elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                    target = target[int(part)]
                else:
                    raise self._fail(where, path, f"$ref {ref!r} points at nothing")
            self.defs[name] = None  # being made: a recursive reference finds the name
            self.defs[name] = self._node(target, parts, root, where, depth + 1)
        return {"$ref": f"#/$defs/{name}"}

    def _values(self, node: dict, path: list, root: int, where: str) -> dict:
        values = [node["const"]] if "const" in node else node["enum"]
        if "const" in node and "enum" in node:
            raise self._fail(where, path, "give enum or const, not both")
        if not isinstance(values, list) or not values:
            raise self._fail(where, path, "enum must be a non-empty array")
        if len(values) > MAX_ENUM_VALUES:
            raise self._fail(where, path, f"enum has more than {MAX_ENUM_VALUES} values")
        rest = {k: v for k, v in node.items() if k not in ("enum", "const")}
        if set(rest) - ANNOTATIONS:
            try:
                validator = validator_for(rest, False)
                bad = [v for v in values if not validator.is_valid(v)]
            except Exception:  # noqa: BLE001 - a reference into the root: the output is validated anyway
                bad = []
            if bad:
                raise self._fail(where, path, f"the value {json.dumps(bad[0])[:80]} of enum/const does not "
                                              f"match the schema's other keywords")
        return {"enum": values}

    def _only(self, node: dict, allowed: set[str], path: list, where: str, kind: str) -> None:
        extra = set(node) - ANNOTATIONS - allowed - {"type"}
        if extra:
            key = sorted(extra)[0]
            raise self._fail(where, path, f"`{key}` is not supported for {kind} values (the grammar cannot "
                                          f"enforce it)")

    def _object(self, node, out, path, root, where, depth):
        self._only(node, {"properties", "required", "additionalProperties"}, path, where, "object")
        props = node.get("properties")
        required = node.get("required", [])
        extra = node.get("additionalProperties", None)
        if props:
            missing = [r for r in required if r not in props]
            if missing:
                raise self._fail(where, path, f"required property {missing[0]!r} is not in properties")
            if extra not in (None, False):
                raise self._fail(where, path, "additionalProperties beside properties is not supported (the "
                                              "grammar could repeat a declared key); use false or leave it out")
            out["properties"] = {k: self._node(v, path + ["properties", k], root, where, depth + 1)
                                 for k, v in props.items()}
            out["required"] = list(required)
            out["additionalProperties"] = False
        else:
            if required:
                raise self._fail(where, path, "required names properties the schema does not define")
            if extra is False:
                out["properties"] = {}
                out["additionalProperties"] = False
            elif isinstance(extra, dict) and set(extra) - ANNOTATIONS:
                out["additionalProperties"] = self._node(extra, path + ["additionalProperties"], root, where,
                                                         depth + 1)
        return out

    def _array(self, node, out, path, root, where, depth):
        self._only(node, {"items", "prefixItems", "minItems", "maxItems", "uniqueItems"}, path, where, "array")
        low, high = self._bounds(node, ("minItems", "maxItems"), MAX_REPEAT, "array", path, where)
        if "prefixItems" in node:
            if "items" in node or "minItems" in node or "maxItems" in node:
                raise self._fail(where, path, "prefixItems with items, minItems or maxItems is not supported: "
                                              "prefixItems alone makes a fixed-length array")
            tuple_items = node["prefixItems"]
            if len(tuple_items) > MAX_REPEAT:
                raise self._fail(where, path, f"prefixItems with more than {MAX_REPEAT} items is not supported")
            out["prefixItems"] = [self._node(s, path + ["prefixItems", i], root, where, depth + 1)
                                  for i, s in enumerate(tuple_items)]
            return out
        items = node.get("items", True)
        if isinstance(items, list):
            raise self._fail(where, path, "items as an array (a tuple) is not supported: use prefixItems")
        if items is False:
            if low > 0:
                raise self._fail(where, path, "items: false with minItems matches nothing")
            out["maxItems"] = 0
            out["items"] = {"type": "null"}
            return out
        out["items"] = self._node(items, path + ["items"], root, where, depth + 1)
        if low:
            out["minItems"] = low
        if high is not None:
            out["maxItems"] = high
        return out

    def _bounds(self, node, keys: tuple[str, str], cap: int, kind: str, path, where) -> tuple[int, int | None]:
        """A length range (``minItems``/``maxItems``, ``minLength``/``maxLength``): each bound at most ``cap``
        (the grammar repeats what it bounds), the low one not above the high one."""
        (low_key, high_key) = keys
        low, high = node.get(low_key, 0), node.get(high_key)
        for name, bound in ((low_key, low), (high_key, high)):
            if bound is not None and bound > cap:
                raise self._fail(where, path, f"{name} over {cap} is not supported")
        if high is not None and low > high:
            raise self._fail(where, path, f"{low_key} is greater than {high_key}: no {kind} matches")
        return low, high

    def _string(self, node, out, path, root, where, depth):
        self._only(node, {"minLength", "maxLength", "pattern", "format"}, path, where, "string")
        given = [k for k in ("pattern", "format") if k in node] + (
            ["minLength/maxLength"] if "minLength" in node or "maxLength" in node else [])
        if len(given) > 1:
            raise self._fail(where, path, f"{' and '.join(given)} together are not supported: the grammar "
                                          f"enforces one of them")
        if "format" in node:
            if node["format"] not in FORMATS:
                raise self._fail(where, path, f"format {str(node['format'])[:40]!r} is not supported (the grammar "
                                              f"enforces {', '.join(FORMATS)})")
            out["format"] = node["format"]
        elif "pattern" in node:
            pattern = _checked_pattern(node["pattern"], lambda m: self._fail(where, path, m))
            if pattern not in self._patterns:
                try:
                    pattern_automaton(pattern, self._pattern_budget)  # what the grammar will be, measured
                except PatternError as e:
                    raise self._fail(where, path, f"pattern {pattern[:60]!r}: {e}") from None
                self._patterns.add(pattern)
            out["pattern"] = pattern
        else:
            low, high = self._bounds(node, ("minLength", "maxLength"), MAX_LENGTH, "string", path, where)
            if "minLength" in node:
                out["minLength"] = low
            if high is not None:
                out["maxLength"] = high
        return out

    def _integer(self, node, out, path, root, where, depth):
        self._only(node, {"minimum", "maximum"}, path, where, "integer")
        if "minimum" in node or "maximum" in node:
            low, high = node.get("minimum"), node.get("maximum")
            if low is None or high is None:
                raise self._fail(where, path, "an integer bound is enforced only with both minimum and maximum "
                                              f"(at most {MAX_INT_RANGE} values apart)")
            low, high = int(-(-low // 1)), int(high // 1)  # the integers within [minimum, maximum]
            if high < low:
                raise self._fail(where, path, "no integer lies between minimum and maximum")
            if high - low + 1 > MAX_INT_RANGE:
                raise self._fail(where, path, f"integer minimum..maximum spans more than {MAX_INT_RANGE} values; "
                                              f"the grammar enforces narrower ranges only")
            return {"enum": list(range(low, high + 1))}
        return out

    def _scalar(self, node, out, path, root, where, depth):
        for key in ("minimum", "maximum"):
            if key in node:
                raise self._fail(where, path, f"`{key}` is not supported for {out['type']} values: the grammar "
                                              f"bounds only integers, with both minimum and maximum")
        self._only(node, set(), path, where, out["type"])
        return out


def _implied_type(node: dict) -> str | None:
    keys = set(node)
    if keys & {"properties", "required", "additionalProperties"}:
        return "object"
    if keys & {"items", "prefixItems", "minItems", "maxItems"}:
        return "array"
    if keys & {"pattern", "format", "minLength", "maxLength"}:
        return "string"
    return None


#: A pattern the grammar can enforce inside a JSON string: literal characters, escapes of
#: punctuation and \d \w, classes without negation whose ranges hold no quote, backslash or control.
_PATTERN_TOKEN = re.compile(r"""\\[dw]|\\[.\-+*?()\[\]{}|^$/]|\[[^\]]*\]|\{\d+(,\d*)?\}|[()|*+?]|[^\\.\[\]{}"]""")


def _checked_pattern(pattern: Any, fail: Callable[[str], SchemaError]) -> str:
    if not isinstance(pattern, str) or len(pattern) > 1000:
        raise fail("pattern must be a string of at most 1000 characters")
    if not (pattern.startswith("^") and pattern.endswith("$") and len(pattern) >= 2):
        raise fail("a pattern must be anchored, ^...$ (the grammar makes the whole string match it)")
    body = pattern[1:-1]
    at = depth = 0
    while at < len(body):
        m = _PATTERN_TOKEN.match(body, at)
        if m is None:
            raise fail(f"pattern {pattern[:60]!r}: {body[at:at + 10]!r} is not supported (use literal "
                       f"characters, \\d, \\w, classes like [a-z0-9_] and quantifiers; no '.', "
                       f"negated classes, quotes or backslashes)")
        token = m.group(0)
        if token.startswith("[") and not _safe_class(token[1:-1]):
            raise fail(f"pattern {pattern[:60]!r}: the class {token!r} could put a quote, a backslash or a "
                       f"control character inside the JSON string")
        if token.startswith("{") and max(int(x) for x in token[1:-1].split(",") if x) > MAX_REPEAT:
            raise fail(f"pattern {pattern[:60]!r}: the repetition {token} is over {MAX_REPEAT}")
        if token.isprintable() is False:
            raise fail(f"pattern {pattern[:60]!r} holds a control character")
        depth += {"(": 1, ")": -1}.get(token, 0)
        if depth > MAX_PATTERN_DEPTH:  # Python's own re fails near 500 (RecursionError)
            raise fail(f"pattern {pattern[:60]!r}: groups nest more than {MAX_PATTERN_DEPTH} deep")
        at = m.end()
    try:
        re.compile(pattern)
    except re.error as e:
        raise fail(f"pattern {pattern[:60]!r} is not a regular expression: {e}") from None
    return pattern


def _safe_class(body: str) -> bool:
    if not body or body.startswith("^") or "\\" in body.replace("\\d", "").replace("\\w", "").replace("\\-", "") \
            .replace("\\.", "").replace("\\]", ""):
        return False
    chars = body.replace("\\d", "0").replace("\\w", "a").replace("\\-", "-").replace("\\.", ".").replace("\\]", "]")
    i = 0
    while i < len(chars):
        if i + 2 < len(chars) and chars[i + 1] == "-":
            low, high = ord(chars[i]), ord(chars[i + 2])
            if low > high or low <= 0x22 <= high or low <= 0x5C <= high or low < 0x20:
                return False
            i += 3
            continue
        if chars[i] in '"\\' or ord(chars[i]) < 0x20:
            return False
        i += 1
    return True


_import_lock = threading.Lock()


def _jsonschema():
    """``jsonschema``, imported on first use -- without ``rfc3987_syntax``.

    jsonschema imports every format checker's library it finds when it is
    imported; ``rfc3987_syntax`` (the ``iri`` format, pulled in by
    jupyter-events' ``jsonschema[format-nongpl]``) builds a parser as it
    loads: about 1 s on an idle machine, over 10 s on a loaded one, on the
    thread of the first job that checks a schema, where no deadline reaches
    (a job ended that much past its time limit). Hidden from that first
    import, jsonschema simply has no ``iri`` checker, which nothing here
    uses; whoever imports ``rfc3987_syntax`` later gets it as usual.
    """
    with _import_lock:
        if "jsonschema" not in sys.modules and "rfc3987_syntax" not in sys.modules:
            sys.modules["rfc3987_syntax"] = None  # type: ignore[assignment]  # its import raises ImportError
            try:
                import jsonschema  # deferred: heavy, and only a structured infer needs it
            finally:
                if sys.modules.get("rfc3987_syntax", False) is None:
                    del sys.modules["rfc3987_syntax"]
    import jsonschema  # deferred: heavy, and only a structured infer needs it

    return jsonschema


def _check_is_json_schema(value: Any, where: str) -> None:
    jsonschema = _jsonschema()

    if not isinstance(value, (dict, bool)):
        raise SchemaError(f"{where} must be a JSON Schema (an object)")
    try:
        cls = jsonschema.validators.validator_for(value, default=jsonschema.Draft202012Validator)
        cls.check_schema(value)
    except jsonschema.exceptions.SchemaError as e:
        location = _pointer(list(e.path))
        raise SchemaError(f"{where} is not a valid JSON Schema at {location}: {e.message[:300]}") from None
    except jsonschema.exceptions.UnknownType as e:  # pragma: no cover - check_schema catches types
        raise SchemaError(f"{where}: {e}") from None
    except RecursionError:  # a pattern Python's re cannot compile (groups nested ~500 deep), or the schema itself
        raise SchemaError(f"{where} is nested too deeply to check (its structure or a pattern's groups)") from None


#: Bytes of memory a validator holds per byte of its schema's JSON: 1.5 for an enum of long strings, 33 for
#: small nested objects (measured with tracemalloc); validators are weighed at the high end.
VALIDATOR_BYTES_PER_SCHEMA_BYTE = 40
#: The bytes kept, between infers, of validators and of checked specs.
VALIDATOR_MEMO_BYTES = 16 * 1024 * 1024
SPEC_MEMO_BYTES = 8 * 1024 * 1024

_validators = BytesLRU(VALIDATOR_MEMO_BYTES)


def _make_validator(schema_json: str, strict_format: bool):
    jsonschema = _jsonschema()

    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER if strict_format else None)


def validator_for(schema: Any, strict_format: bool = True):
    """A validator for ``schema``, kept between infers in a memo bounded in bytes."""
    schema_json = json.dumps(schema, sort_keys=True)
    return _validators.get_or_make((schema_json, strict_format), lambda: _make_validator(schema_json, strict_format),
                                   lambda _v: sys.getsizeof(schema_json) * VALIDATOR_BYTES_PER_SCHEMA_BYTE)


def first_error(validator, value: Any) -> str | None:
    jsonschema = _jsonschema()

    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    if error is None:
        return None
    return f"{error.message[:300]} (at {_pointer(list(error.absolute_path))})"


