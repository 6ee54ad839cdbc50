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
5. **Trust** (``--labelled N``): a labelled map of ``extract.c`` on the embedded model over N short notes made
   here (a customer's name and an order number each, known), scored by ``json_fields``: per field the accuracy
   of the most confident half against the least confident half, and the AUROC, with the counts they rest on
   (``ScoreSummary.signals``). The baseline is the field's own accuracy over all its items.
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
LABELLED_SCHEMA = {"type": "object", "properties": {"customer": {"type": "string"}, "order": {"type": "integer"}},
                   "required": ["customer", "order"], "additionalProperties": False}


def labelled(n: int, rng: random.Random, tmp: Path) -> dict:
    """A labelled map of the embedded model: notes with a known customer and order number, scored, and the
    trust figures of its summary."""
    docs = tmp / "notes"
    docs.mkdir(exist_ok=True)
    items, expected = [], []
    for i in range(n):
        name, order = f"{rng.choice(FIRST)} {rng.choice(LAST)}", rng.randrange(10_000, 99_999)
        noise = filler(rng, rng.randrange(8, 40))
        text = (f"{noise}. Customer {name} wrote about order {order}: the {rng.choice(WORDS)} arrived late."
                if i % 2 else f"Order {order} ({rng.choice(WORDS)}), {noise}; signed, {name}.")
        path = docs / f"n{i}.txt"
        path.write_text(text, encoding="utf-8")
        items.append({"path": str(path), "schema": LABELLED_SCHEMA, "max_tokens": 48, "window": 1024})
        expected.append({"facts": {"customer": name, "order": order}})
    started = time.perf_counter()
    result = tj.map(ROOT / "guests" / "examples" / "extract.c", items, tmp / "labelled", read=[docs],
                    expected=expected, scorer="json_fields")
    seconds = time.perf_counter() - started
    summary = result.score_summary()
    return {"items": n, "completed": result.completed, "seconds": seconds, "summary": summary,
            "fields": {row.name: [row.right, row.labelled] for row in summary.field_rows},
            "signals": [s.to_json() for s in summary.signals]}


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
    print(f"  labelled map: {t['completed']} of {t['items']} items on the embedded model in {t['seconds']:.0f} s")
    for line in t["summary"].lines():
        print("  " + line)
    for s in t["signals"]:
        top, rest = s.get("confident_half"), s.get("least_confident_half")
        if top and rest:
            right, count = t["fields"][s["field"]]
            print(f"  {s['field']}: most confident half {top['right']}/{top['count']} right against the least "
                  f"confident half {rest['right']}/{rest['count']} (baseline: all {right}/{count}); AUROC "
                  f"{'-' if s['auroc'] is None else s['auroc']} ({s['auroc_right']} right, {s['auroc_wrong']} wrong)")
    print(f"load: {os.getloadavg()[0]:.2f}")
    print(json.dumps({k: v for k, v in t.items() if k != "summary"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
