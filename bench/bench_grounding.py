"""Sources: how well the locator finds a result's fields in what a job read, and what it costs.

Run from the repository root::

    python bench/bench_grounding.py           # 400 documents, 40 jobs
    python bench/bench_grounding.py --quick   # 100 documents, 10 jobs
    python bench/bench_grounding.py --real    # also: the share of item time on the embedded model

1. **Precision and recall** against true spans: documents made here, each with fields planted at known byte
   offsets, given to ``host.grounding.locate`` as exact values and as the normalised spellings a model writes
   (case changed, digit groups dropped, ISO dates of spelled-out days, runs of spaces). A field counts as found
   right when its best source overlaps its true span. Goal: >= 0.95 each.
2. **Planted values flagged**: values in no document (what a scripted model invents) must be found nowhere.
   Goal: 100%.
3. **Cost**: jobs that slice a 4 KiB document and return 12 fields, with the locator timed inside each job,
   against the same job's own wall time (the baseline, measured in the same run): the locator's share of item
   time. ``--real``: the same for ``guests/examples/extract.c`` on the embedded model, and beside it the
   confidence's share (each generated token's record, ``llama.token_logprob``, after the grammar's mask, and
   the fields' confidences, ``reactor.answer_confidence``), timed the same way. Goal: <= 2% together.
4. **Places and spellings**: invoices in six languages (English, German, French, Spanish, Italian, Polish, each
   writing amounts and days its own way), four fields each: "not grounded" (found nowhere, under another field's
   label, fuzzy or ambiguous) as a detector of a wrong value -- values found in the wrong place (the customer as
   the vendor, the invoice date as the due date, the subtotal as the total, the order number as the invoice
   number), invented values and one-character forgeries -- against the right values, which it must not flag.
   Goal: recall >= 0.85 at precision >= 0.95, and no forgery grounded.
5. **Labelled** (``--labelled N``; ``--only-labelled`` skips 1-4): ``extract.c`` mapped on the embedded model
   over N short notes (a customer and an order number in running text) and N invoices in six languages (European
   amounts and days, every field beside a wrong-place value), each against its known facts: "not grounded" (null,
   not found, elsewhere, fuzzy, ambiguous) as a detector of the model's wrong values (goal: recall >= 0.85 at
   precision >= 0.95); quote mode against the free answer -- the string fields' accuracy, tokens/s and items/s;
   the locator's share of item time (goal < 2%); the trust figures of each free map's summary.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tensorjob_jupyter as tj  # noqa: E402
from tensorjob_jupyter.host import grounding, reactor  # noqa: E402
from tensorjob_jupyter.inference import llama  # noqa: E402
from tensorjob_jupyter.host.windows import Place, Segment  # noqa: E402

WORDS = ("report invoice customer order kettle widget battery charger delivery refund warranty model serial "
         "account branch office quarter revenue growth market team meeting review policy").split()
NAMES = ("Ann Lee", "Zoë Ångström", "Bo Ng", "José Müller", "Łukasz Wiśniewski", "Søren Kierkegaard")


def filler(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def make_document(rng: random.Random) -> tuple[str, list[tuple[object, str, int, int]]]:
    """A document and its fields: (value as a model would write it, kind, true start, true end) in bytes."""
    parts, fields, pos = [], [], 0

    def put(text: str, value: object, kind: str) -> None:
        nonlocal pos
        gap = filler(rng, rng.randint(5, 30)) + " "
        parts.append(gap)
        pos += len(gap.encode())
        start = pos
        parts.append(text)
        pos += len(text.encode())
        fields.append((value, kind, start, pos))
        parts.append(". ")
        pos += 2

    name, other = rng.sample(NAMES, 2)  # two values: a field's true span is its only one
    put(name, name, "exact")
    put(other.upper(), other, "normalised")
    n = rng.randint(1000, 10**9)
    put(f"{n:,}", n, "normalised")
    put(str(n + 7), n + 7, "exact")
    day = datetime.date(2000, 1, 1) + datetime.timedelta(days=rng.randint(0, 9000))
    put(day.strftime("%B %-d, %Y"), day.isoformat(), "normalised")
    phrase = filler(rng, 4)
    put(phrase.replace(" ", "   "), phrase, "normalised")
    serial = f"SN-{rng.randint(10**5, 10**6)}"
    put(serial, serial, "exact")
    parts.append(filler(rng, 20))
    return "".join(parts), fields


def quality(n_docs: int, rng: random.Random) -> dict:
    right = {"exact": 0, "normalised": 0}
    total = dict(right)
    found = dict(right)
    planted = flagged = 0
    for i in range(n_docs):
        text, fields = make_document(rng)
        segment = [Segment(Place(file=f"/bench/{i}.txt"), 0, text.encode())]
        result = {f"f{k}": value for k, (value, _, _, _) in enumerate(fields)}
        invented = [f"{rng.choice(NAMES)} Jr", f"{filler(rng, 3)} {rng.randint(10**9, 10**10)}"]
        result.update({f"planted{k}": v for k, v in enumerate(invented)})
        sources = grounding.locate(result, segment)
        for k, (_, kind, start, end) in enumerate(fields):
            total[kind] += 1
            got = sources.get(f"f{k}") or []
            if got:
                found[kind] += 1
                if got[0]["start"] < end and start < got[0]["end"]:
                    right[kind] += 1
        for k in range(len(invented)):
            planted += 1
            flagged += sources.get(f"planted{k}") == []
    return {kind: {"precision": right[kind] / max(1, found[kind]), "recall": right[kind] / max(1, total[kind]),
                   "fields": total[kind]} for kind in total} | {"planted_flagged": flagged / planted,
                                                                 "planted": planted}


#: Invoices in six languages: each field's label, and how the language writes an amount and a day.
LANGUAGES = {
    "en": dict(vendor="Supplier:", customer="Bill to:", invoice_number="Invoice number:", order="Order number:",
               invoice_date="Invoice date:", due_date="Due date:", subtotal="Subtotal:", total="Total due:",
               amount=lambda x: f"${x:,.2f}", day=lambda d: d.strftime("%B %-d, %Y")),
    "de": dict(vendor="Lieferant:", customer="Rechnungsempfänger:", invoice_number="Rechnungsnummer:",
               order="Bestellnummer:", invoice_date="Rechnungsdatum:", due_date="Fällig am:",
               subtotal="Zwischensumme:", total="Gesamtbetrag:",
               amount=lambda x: f"{x:,.2f} €".replace(",", "_").replace(".", ",").replace("_", "."),
               day=lambda d: d.strftime("%d.%m.%Y")),
    "fr": dict(vendor="Fournisseur :", customer="Client :", invoice_number="Facture n° :",
               order="Numéro de commande :", invoice_date="Date de facture :", due_date="Date d'échéance :",
               subtotal="Sous-total :", total="Total TTC :",
               amount=lambda x: f"{x:,.2f} €".replace(",", "\u202f").replace(".", ","),
               day=lambda d: f"{d.day} {['janvier', 'février', 'mars', 'avril', 'mai', 'juin', 'juillet', 'août', 'septembre', 'octobre', 'novembre', 'décembre'][d.month - 1]} {d.year}"),  # noqa: E501
    "es": dict(vendor="Proveedor:", customer="Cliente:", invoice_number="Número de factura:",
               order="Número de pedido:", invoice_date="Fecha de factura:", due_date="Fecha de vencimiento:",
               subtotal="Base imponible:", total="Importe total:",
               amount=lambda x: f"{x:,.2f} €".replace(",", "_").replace(".", ",").replace("_", "."),
               day=lambda d: f"{d.day} de {['enero', 'febrero', 'marzo', 'abril', 'mayo', 'junio', 'julio', 'agosto', 'septiembre', 'octubre', 'noviembre', 'diciembre'][d.month - 1]} de {d.year}"),  # noqa: E501
    "it": dict(vendor="Fornitore:", customer="Cliente:", invoice_number="Numero fattura:", order="Numero ordine:",
               invoice_date="Data fattura:", due_date="Data di scadenza:", subtotal="Imponibile:",
               total="Importo totale:",
               amount=lambda x: "€ " + f"{x:,.2f}".replace(",", "_").replace(".", ",").replace("_", "."),
               day=lambda d: f"{d.day} {['gennaio', 'febbraio', 'marzo', 'aprile', 'maggio', 'giugno', 'luglio', 'agosto', 'settembre', 'ottobre', 'novembre', 'dicembre'][d.month - 1]} {d.year}"),  # noqa: E501
    "pl": dict(vendor="Sprzedawca:", customer="Nabywca:", invoice_number="Faktura nr:", order="Numer zamówienia:",
               invoice_date="Data wystawienia:", due_date="Termin płatności:", subtotal="Wartość netto:",
               total="Do zapłaty:", amount=lambda x: f"{x:,.2f} zł".replace(",", " ").replace(".", ","),
               day=lambda d: d.strftime("%d.%m.%Y")),
}
COMPANIES = ("ACME Supplies Ltd", "Oakley Legal Partners LLP", "Nordwind Logistik GmbH", "Atelier Lumière SARL",
             "Construcciones Iberia SL", "Tessuti Fiorentini Srl", "Zakład Mechaniczny Kowalski", "Harbour Bridge Co",
             "Zoë Ångström Design", "Kettle & Sons")


def forged(value: object, rng: random.Random) -> object:
    """``value`` with one character changed: what a careless or hostile answer looks like."""
    if isinstance(value, float):
        return round(value + rng.choice((-9, 9, 0.09, -0.09)), 2)
    text = str(value)
    i = rng.randrange(len(text))
    options = "0123456789" if text[i].isdigit() else "abcdefghijklmnopqrstuvwxyz"
    return text[:i] + rng.choice([c for c in options if c != text[i].lower()]) + text[i + 1:]


def invoice(rng: random.Random, language: str) -> tuple[str, dict, dict]:
    """An invoice, the right answers for four fields, and for each a value found in it in the wrong place."""
    labels = LANGUAGES[language]
    vendor, customer = rng.sample(COMPANIES, 2)
    number, order = f"INV-{rng.randint(2020, 2026)}-{rng.randint(100, 9999)}", f"PO-{rng.randint(10000, 99999)}"
    issued = datetime.date(2024, rng.randint(1, 12), rng.randint(1, 28))
    due = issued + datetime.timedelta(days=rng.choice((14, 30, 45)))
    subtotal = round(rng.uniform(100, 9000), 2) + 0.01
    total = round(subtotal * 1.19, 2)
    if total == round(total):
        total += 0.01
    apart = rng.random() < 0.5  # a form's layout: each label on its own line, the value on the next
    pairs = [(labels["vendor"], vendor), (labels["customer"], customer), (labels["invoice_number"], number),
             (labels["order"], order), (labels["invoice_date"], labels["day"](issued)),
             (labels["due_date"], labels["day"](due)), ("", filler(rng, 12)),
             (labels["subtotal"], labels["amount"](subtotal)), (labels["total"], labels["amount"](total)),
             ("", f"{filler(rng, 4)}. {vendor}, {filler(rng, 3)}.")]  # the vendor again, under no label
    lines = [f"{label}\n{value}" if apart and label else f"{label} {value}".strip() for label, value in pairs]
    right = {"vendor": vendor, "invoice_number": number, "due_date": due.isoformat(), "total": total}
    wrong = {"vendor": customer, "invoice_number": order, "due_date": issued.isoformat(), "total": subtotal}
    return "\n".join(lines) + "\n", right, wrong


def places(n_docs: int, rng: random.Random) -> dict:
    """"Not grounded" (found nowhere, elsewhere, fuzzy or ambiguous) as a detector of a wrong value, on invoices
    in six languages: right values (as a model writes them: ISO dates, plain numbers), values found in the wrong
    place, invented ones and one-character forgeries of the right ones."""
    counts = {"right": [0, 0], "elsewhere": [0, 0], "invented": [0, 0], "forged": [0, 0]}  # [flagged, all]
    by_language: dict[str, list[int]] = {}
    for i in range(n_docs):
        language = list(LANGUAGES)[i % len(LANGUAGES)]
        text, right, wrong = invoice(rng, language)
        segment = [Segment(Place(file=f"/bench/invoice-{i}.txt"), 0, text.encode())]
        cases = {"right": right, "elsewhere": wrong,
                 "invented": {"vendor": f"{filler(rng, 2).title()} Holdings", "invoice_number": f"INV-{rng.randint(1, 99)}",
                              "due_date": "2031-01-17", "total": 123456.78},
                 "forged": {k: forged(v, rng) for k, v in right.items() if k != "due_date"}}
        for kind, result in cases.items():
            found = grounding.locate(result, segment)
            for field in result:
                flagged = grounding.grounds(found.get(field)) is not True
                counts[kind][0] += flagged
                counts[kind][1] += 1
                if kind == "right":
                    by_language.setdefault(language, [0, 0])[0] += not flagged
                    by_language[language][1] += 1
    wrong_flagged = sum(counts[k][0] for k in ("elsewhere", "invented", "forged"))
    wrong_all = sum(counts[k][1] for k in ("elsewhere", "invented", "forged"))
    flagged_all = wrong_flagged + counts["right"][0]
    return {"precision": wrong_flagged / max(1, flagged_all), "recall": wrong_flagged / max(1, wrong_all),
            "counts": counts, "right_found_by_language": by_language}


class Timed:
    """A module-level function timed while the block runs: its seconds and calls, summed (whatever thread
    calls it: ``llama.token_logprob`` runs on the engine's, within the item's wall time)."""

    def __init__(self, module, name: str):
        self.module, self.name = module, name
        self.seconds, self.calls, self._original = 0.0, 0, getattr(module, name)

    def __enter__(self):
        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return self._original(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t
                self.calls += 1
        setattr(self.module, self.name, timed)
        return self

    def __exit__(self, *exc):
        setattr(self.module, self.name, self._original)


def cost(jobs: int, rng: random.Random, tmp: Path, *, real: bool) -> dict:
    docs = tmp / "docs"
    docs.mkdir(exist_ok=True)
    paths = []
    for i in range(jobs):
        text, _ = make_document(rng)
        path = docs / f"d{i}.txt"
        path.write_text((text + " ") * max(1, 4096 // len(text)), encoding="utf-8")
        paths.append(path)
    if real:
        guest = ROOT / "guests" / "examples" / "extract.c"
        inputs = [{"path": str(p), "max_tokens": 160, "window": 2048} for p in paths]
        model = None
    else:
        guest = ROOT / "tests" / "guests" / "quote.c"
        inputs = [{"path": str(p), "claim": {f"c{k}": rng.choice(WORDS) + " " + rng.choice(WORDS) for k in range(11)}}
                  for p in paths]
        model = None
    item_s = []
    with Timed(reactor, "ground") as located, Timed(llama, "token_logprob") as recorded, \
            Timed(reactor, "answer_confidence") as scored:
        for given in inputs:
            t = time.perf_counter()
            envelope = tj.Job(guest, input=given, read=[docs], runs_dir=tmp / "runs", model=model).start().wait(600)
            item_s.append(time.perf_counter() - t)
            if not envelope.ok:
                raise SystemExit(f"a bench job failed: {envelope.error}")
    total = sum(item_s)
    confidence_s = recorded.seconds + scored.seconds
    return {"jobs": jobs, "item_ms_median": 1000 * statistics.median(item_s),
            "locate_ms_mean": 1000 * located.seconds / max(1, located.calls), "share": located.seconds / total,
            "tokens_recorded": recorded.calls, "confidence_ms_mean": 1000 * confidence_s / jobs,
            "confidence_share": confidence_s / total, "sources_and_confidence_share": (located.seconds + confidence_s) / total}


FIRST = ("Ada", "Bruno", "Chen", "Dara", "Emil", "Farah", "Goran", "Hana", "Ivo", "Jun", "Kofi", "Lena")
LAST = ("Okafor", "Lindqvist", "Moreau", "Tanaka", "Novak", "Haddad", "Silva", "Kowalski")
NOTE_SCHEMA = {"type": "object", "properties": {"customer": {"type": "string"}, "order": {"type": "integer"}},
               "required": ["customer", "order"], "additionalProperties": False}
INVOICE_SCHEMA = {"type": "object", "properties": {
    "vendor": {"type": "string"}, "invoice_number": {"type": "string"},
    "due_date": {"type": "string", "format": "date"}, "total": {"type": "number"}},
    "required": ["vendor", "invoice_number", "due_date", "total"], "additionalProperties": False}
EXTRACT = ROOT / "guests" / "examples" / "extract.c"


def labelled_sets(n: int, rng: random.Random, tmp: Path) -> dict[str, tuple[Path, list[dict], list[dict]]]:
    """Two labelled sets of ``n`` documents each, (folder, inputs, true facts) by name: short notes (a customer's
    name and an order number in running text) and invoices in six languages (European amounts and days, each
    with a wrong-place value for every field beside the right one)."""
    sets = {}
    notes, invoices = tmp / "notes", tmp / "invoices"
    notes.mkdir(exist_ok=True)
    invoices.mkdir(exist_ok=True)
    items, truths = [], []
    for i in range(n):
        name, order = f"{rng.choice(FIRST)} {rng.choice(LAST)}", rng.randrange(10_000, 99_999)
        noise = filler(rng, rng.randrange(8, 40))
        text = (f"{noise}. Customer {name} wrote about order {order}: the {rng.choice(WORDS)} arrived late."
                if i % 2 else f"Order {order} ({rng.choice(WORDS)}), {noise}; signed, {name}.")
        path = notes / f"n{i}.txt"
        path.write_text(text, encoding="utf-8")
        items.append({"path": str(path), "schema": NOTE_SCHEMA, "max_tokens": 48, "window": 1024})
        truths.append({"customer": name, "order": order})
    sets["notes"] = (notes, items, truths)
    items, truths = [], []
    for i in range(n):
        text, right, _ = invoice(rng, list(LANGUAGES)[i % len(LANGUAGES)])
        path = invoices / f"invoice-{i}.txt"
        path.write_text(text, encoding="utf-8")
        items.append({"path": str(path), "schema": INVOICE_SCHEMA, "max_tokens": 96, "window": 2048})
        truths.append(right)
    sets["invoices"] = (invoices, items, truths)
    return sets


def is_right(value: object, truth: object) -> bool:
    if isinstance(truth, (int, float)) and not isinstance(truth, bool):
        return isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value - truth) < 0.005
    return isinstance(value, str) and value.strip().casefold() == str(truth).casefold()


def labelled_map(name: str, folder: Path, items: list[dict], truths: list[dict], tmp: Path, *, quote: bool) -> dict:
    """One labelled map of ``extract.c`` on the embedded model: each value judged against the truth, with its
    grounding; the locator's time and the items' time and tokens."""
    started = time.perf_counter()
    with Timed(reactor, "ground") as located:
        result = tj.map(EXTRACT, [{**item, "quote": quote} for item in items], tmp / f"{name}-{quote}",
                        read=[folder], expected=[{"facts": t} for t in truths], scorer="json_fields")
    seconds = time.perf_counter() - started
    usages = [json.loads(p.read_text(encoding="utf-8")).get("usage") or {}
              for p in (tmp / f"{name}-{quote}" / "jobs").glob("*/envelope.json")]
    values = []  # (field, right, grounded: True / False / None for a null)
    for row in result.rows():
        truth = truths[row["item"]]
        facts = row.get("result.facts") or {}
        for field, expected in truth.items():
            value = facts.get(field) if row["status"] == "completed" else None
            values.append((field, is_right(value, expected), row.get(f"grounded.facts.{field}")))
    item_s = sum(u.get("duration_ms", 0) for u in usages) / 1000
    return {"set": name, "quote": quote, "items": len(items), "completed": result.completed, "seconds": seconds,
            "tokens_out": sum(u.get("tokens_out", 0) for u in usages), "item_s": item_s,
            "locate_s": located.seconds, "values": values, "summary": result.score_summary() if not quote else None}


def detector(values: list[tuple[str, bool, object]]) -> dict:
    """"Not grounded" (not found, elsewhere, fuzzy, ambiguous -- or null: a null claims nothing) as a detector of
    a wrong value."""
    flagged_wrong = sum(1 for _, right, grounded in values if grounded is not True and not right)
    flagged = sum(1 for _, _, grounded in values if grounded is not True)
    wrong = sum(1 for _, right, _ in values if not right)
    return {"precision": flagged_wrong / flagged if flagged else None, "recall": flagged_wrong / wrong if wrong else None,
            "flagged": flagged, "wrong": wrong, "values": len(values)}


def accuracy(values: list[tuple[str, bool, object]], fields: set[str] | None = None) -> tuple[int, int]:
    chosen = [right for field, right, _ in values if fields is None or field in fields]
    return sum(chosen), len(chosen)


def labelled(n: int, rng: random.Random, tmp: Path) -> dict:
    """Both labelled sets mapped with free answers and in quote mode."""
    out: dict = {"maps": []}
    sets = labelled_sets(n, rng, tmp)
    folder, items, _ = sets["notes"]
    tj.Job(EXTRACT, input=items[0], read=[folder], runs_dir=tmp / "warm").start().wait(600)  # the model loaded
    for name, (folder, items, truths) in sets.items():
        for quote in (False, True):
            out["maps"].append(labelled_map(name, folder, items, truths, tmp, quote=quote))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--real", action="store_true")
    parser.add_argument("--labelled", type=int, default=0, metavar="N",
                        help="also a labelled map of N notes on the embedded model: the trust figures")
    parser.add_argument("--only-labelled", action="store_true", help="skip 1-3")
    args = parser.parse_args()
    rng = random.Random(36)
    n_docs, jobs = (100, 10) if args.quick else (400, 40)
    print(f"load: {os.getloadavg()[0]:.2f}")
    if args.only_labelled:
        return _labelled(args.labelled or 16, rng)
    q = quality(n_docs, rng)
    for kind in ("exact", "normalised"):
        print(f"{kind:>10}: precision {q[kind]['precision']:.3f}  recall {q[kind]['recall']:.3f}  "
              f"({q[kind]['fields']} fields; goal >= 0.95 each)")
    print(f"   planted: {q['planted_flagged']:.1%} of {q['planted']} flagged not found (goal 100%)")
    p = places(n_docs // 2, rng)
    c = p["counts"]
    print(f"    places: \"not grounded\" as a detector of a wrong value on {n_docs // 2} invoices in six languages: "
          f"precision {p['precision']:.3f}, recall {p['recall']:.3f} (goal: recall >= 0.85 at precision >= 0.95)")
    print(f"            wrong place caught {c['elsewhere'][0]}/{c['elsewhere'][1]}, invented {c['invented'][0]}/"
          f"{c['invented'][1]}, one-character forgeries {c['forged'][0]}/{c['forged'][1]} (false matches: "
          f"{c['forged'][1] - c['forged'][0]}, goal 0); right values wrongly marked {c['right'][0]}/{c['right'][1]}")
    print("            right values grounded by language: " + ", ".join(
        f"{lang} {ok}/{n}" for lang, (ok, n) in p["right_found_by_language"].items()))
    summary = {"quality": q, "places": p}
    with tempfile.TemporaryDirectory() as tmp:
        tj.Job(ROOT / "tests" / "guests" / "quote.c", input={"path": "/", "claim": 0})  # compiled once, not timed
        c = cost(jobs, rng, Path(tmp), real=False)
        print(f"  scripted: locator {c['locate_ms_mean']:.3f} ms a job against an item of {c['item_ms_median']:.1f} ms"
              f" (median): {c['share']:.2%} of a model-free item (the goal is set on the embedded model, --real)")
        summary["cost"] = c
        if args.real:
            r = cost(max(3, jobs // 8), rng, Path(tmp), real=True)
            print(f"  embedded: locator {r['locate_ms_mean']:.3f} ms a job against an item of "
                  f"{r['item_ms_median']:.1f} ms (median): {r['share']:.2%} of item time")
            print(f"  embedded: confidence {r['confidence_ms_mean']:.3f} ms a job ({r['tokens_recorded']} token records"
                  f" in all, and the fields' confidences): {r['confidence_share']:.2%} of item time")
            print(f"  embedded: sources and confidence together {r['sources_and_confidence_share']:.2%} of item time"
                  f" (goal <= 2%)")
            summary["cost_real"] = r
    if args.labelled:
        _labelled(args.labelled, rng)
    print(f"load: {os.getloadavg()[0]:.2f}")
    print(json.dumps(summary))
    return 0


def _labelled(n: int, rng: random.Random) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        t = labelled(n, rng, Path(tmp))
    free = [m for m in t["maps"] if not m["quote"]]
    quoted_fields = {"notes": {"customer"}, "invoices": {"vendor", "invoice_number"}}
    print(f"  labelled: {n} notes and {n} invoices (six languages) on the embedded model, extract.c")
    for m in free:
        d = detector(m["values"])
        print(f"  {m['set']:>9}, free answers: \"not grounded\" as a detector of a wrong value: precision "
              f"{_fmt(d['precision'])}, recall {_fmt(d['recall'])} ({d['flagged']} flagged, {d['wrong']} wrong of "
              f"{d['values']} values)")
    d = detector([v for m in free for v in m["values"]])
    print(f"       both, free answers: precision {_fmt(d['precision'])}, recall {_fmt(d['recall'])} "
          f"(goal: recall >= 0.85 at precision >= 0.95) -- {d['flagged']} flagged, {d['wrong']} wrong of {d['values']}")
    for m in free:
        for line in m["summary"].lines() if m["summary"] is not None else ():
            print(f"  {m['set']:>9}: {line}")
    for name in ("notes", "invoices"):
        a, b = (next(m for m in t["maps"] if m["set"] == name and m["quote"] is q) for q in (False, True))
        for m in (a, b):
            right, count = accuracy(m["values"], quoted_fields[name])
            every, total = accuracy(m["values"])
            grounded = sum(1 for f, _, g in m["values"] if f in quoted_fields[name] and g is True)
            print(f"  {name:>9}, {'quote mode' if m['quote'] else 'free answer'}: string fields {right}/{count} "
                  f"right, {grounded}/{count} grounded; all fields {every}/{total}; {m['completed']}/{m['items']} "
                  f"completed; {m['tokens_out'] / m['seconds']:.1f} tokens/s ({m['tokens_out']} tokens in "
                  f"{m['seconds']:.1f} s)")
        print(f"  {name:>9}: quote mode / free answer, tokens/s: "
              f"{(b['tokens_out'] / b['seconds']) / (a['tokens_out'] / a['seconds']):.2f}x; items/s: "
              f"{a['seconds'] / b['seconds']:.2f}x")
    locate_s, item_s = sum(m["locate_s"] for m in t["maps"]), sum(m["item_s"] for m in t["maps"])
    print(f"  locator: {1000 * locate_s / sum(m['completed'] for m in t['maps']):.2f} ms an item, "
          f"{locate_s / item_s:.3%} of item time on the embedded model (goal < 2%)")
    print(f"load: {os.getloadavg()[0]:.2f}")
    print(json.dumps({"maps": [{k: v for k, v in m.items() if k not in ("values", "summary")}
                               for m in t["maps"]], "detector": d}))
    return 0


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


if __name__ == "__main__":
    sys.exit(main())
