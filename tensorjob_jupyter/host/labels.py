"""Labels: the text a value stands under in a document, and the field that text names.

Invoices, forms and reports put a label before a value ("Due date:", "Bill to:"), and one string can stand under
several. The locator (``grounding.py``) keeps, with each source, the label before its span (``label_before``:
the text on its line before it, or the line above when the value starts its line) and the field the label names
(``FieldNames.named``): a field of the result by its key, or a common field outside it (``SYNONYMS``, the table
docs/maps.md lists). A value found only under labels that name *another* field is found elsewhere -- the invoice
date given as the due date, the customer as the vendor, a subtotal as the total -- and grounds nothing.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Iterable

from tensorjob_jupyter.host.fields import split_path

#: Characters of a label kept (the text nearest the value).
MAX_LABEL_CHARS = 80
#: Bytes looked back for a label: a line, and the line above it.
_LOOK_BACK = 4 * 2 * MAX_LABEL_CHARS

#: Common fields and the labels that name them: English, German, French, Spanish, Italian, Polish (each phrase is
#: compared folded, as whole words). A result's field is one of these when its key is a name or a phrase here.
SYNONYMS: dict[str, tuple[str, ...]] = {
    "vendor": ("vendor", "seller", "supplier", "issued by", "sold by", "bill from", "remit to", "payee",
               "lieferant", "verkäufer", "fournisseur", "vendeur", "proveedor", "vendedor", "fornitore",
               "sprzedawca"),
    "customer": ("customer", "client", "buyer", "bill to", "billed to", "sold to", "ship to", "invoice to",
                 "recipient", "kunde", "rechnungsempfänger", "acheteur", "cliente", "comprador", "destinatario",
                 "nabywca"),
    "invoice_number": ("invoice number", "invoice no", "invoice #", "invoice id", "inv no", "rechnungsnummer",
                       "rechnung nr", "numéro de facture", "facture n", "número de factura", "factura n",
                       "numero fattura", "fattura n", "faktura nr", "numer faktury"),
    "invoice_date": ("invoice date", "date of issue", "issue date", "issued on", "date issued", "rechnungsdatum",
                     "ausstellungsdatum", "date de facture", "date d'émission", "fecha de factura",
                     "fecha de emisión", "data fattura", "data di emissione", "data wystawienia"),
    "due_date": ("due date", "payment due", "due by", "pay by", "due on", "fällig", "fälligkeitsdatum",
                 "zahlbar bis", "échéance", "date d'échéance", "fecha de vencimiento", "vencimiento",
                 "data di scadenza", "scadenza", "termin płatności"),
    "subtotal": ("subtotal", "sub total", "net amount", "net total", "zwischensumme", "nettobetrag",
                 "sous-total", "sous total", "total ht", "base imponible", "imponibile", "subtotale",
                 "wartość netto", "razem netto"),
    "tax": ("tax", "vat", "sales tax", "gst", "mwst", "ust", "tva", "iva"),
    "total": ("total", "total due", "amount due", "balance due", "grand total", "total amount", "amount payable",
              "gesamtbetrag", "gesamtsumme", "endbetrag", "total ttc", "montant total", "net à payer",
              "importe total", "total a pagar", "totale", "importo totale", "do zapłaty", "razem do zapłaty"),
    "quantity": ("quantity", "qty", "menge", "anzahl", "quantité", "cantidad", "quantità"),
    "order_number": ("order number", "order no", "order #", "po number", "purchase order", "bestellnummer",
                     "numéro de commande", "número de pedido", "numero ordine", "numer zamówienia"),
}
_WORD = re.compile(r"[^\W_]+(?:['#-][^\W_]+)*|#")


def fold(text: str) -> str:
    """``text`` as labels compare it: NFKC, case-folded, words separated by single spaces."""
    return " ".join(_WORD.findall(unicodedata.normalize("NFKC", text).casefold()))


#: Letters a line's text before a value needs to be its label on its own (``$``, ``EUR``, ``Nr`` are not).
_LABEL_LETTERS = 4


#: Where a clause ends in running text: a semicolon, ``!``, ``?``, or a full stop after a word of three letters or
#: more and before a capital ("arrived. Customer"; not "excl. shipping", "Nr. der", "St. Louis", "1.2. Due").
_CLAUSE_END = re.compile(r"[;!?]|(?<=[^\W\d_]{3})\.(?=\s+[^\W\d_])")


def label_before(data: bytes, start: int) -> str:
    """The label of a span starting at byte ``start`` of ``data``: the text on its line before it -- from the
    nearest clause end that leaves a label of its own ("...; signed, " is "signed,", "Rechnung Nr. " stays whole) --
    with the last line above that holds text in front when the line's own holds fewer than ``_LABEL_LETTERS``
    letters (a value that starts its line, or stands after a currency sign); at most ``MAX_LABEL_CHARS``."""
    head = data[max(0, start - _LOOK_BACK):start].decode("utf-8", "ignore")
    lines = head.replace("\r", "\n").split("\n")
    label = _last_clause(lines[-1].strip())[-MAX_LABEL_CHARS:]
    if sum(ch.isalpha() for ch in label) < _LABEL_LETTERS:
        above = next((line.strip() for line in reversed(lines[:-1]) if line.strip()), "")
        label = f"{above[-MAX_LABEL_CHARS:]} {label}".strip()
    return label[-MAX_LABEL_CHARS:]


def _last_clause(line: str) -> str:
    """The text after the nearest clause end of ``line`` that leaves ``_LABEL_LETTERS`` letters or more; the line
    when none does (a label is not cut from its own abbreviation)."""
    ends = [m.end() for m in _CLAUSE_END.finditer(line) if m.group() != "." or line[m.end():].lstrip()[:1].isupper()]
    for end in reversed(ends):
        rest = line[end:]
        if sum(ch.isalpha() for ch in rest) >= _LABEL_LETTERS:
            return rest.strip()
    return line


#: ``SYNONYMS`` folded once: each common field's phrases, and the common field each name or phrase names.
_FOLDED = {concept: frozenset(fold(p) for p in phrases) for concept, phrases in SYNONYMS.items()}
_CONCEPT_OF = {**{p: c for c, ps in _FOLDED.items() for p in ps}, **{fold(c.replace("_", " ")): c for c in SYNONYMS}}


def _phrases_of(key: str) -> tuple[str, set[str]]:
    """A field key's concept (a ``SYNONYMS`` name, or the key itself) and the phrases that name it."""
    words = fold(key.replace("_", " ").replace("-", " "))
    concept = _CONCEPT_OF.get(words)
    if concept is not None:
        return concept, set(_FOLDED[concept]) | {words}
    return words, {words} if words else set()


class FieldNames:
    """The fields a label may name: each field of the result by its key (its last key, for a leaf in an array),
    with its synonyms, and the common fields of ``SYNONYMS`` that the result lacks."""

    def __init__(self, paths: Iterable[str]):
        self._own: dict[str, tuple[str, set[str]]] = {}  # path -> (concept, phrases)
        concepts: dict[str, set[str]] = {}
        self._result_concepts: set[str] = set()
        for path in paths:
            keys = [p for p in split_path(path) if not (p.isascii() and p.isdigit())]
            if not keys:
                continue
            concept, phrases = _phrases_of(keys[-1])
            self._own[path] = (concept, phrases)
            concepts.setdefault(concept, set()).update(phrases)
            self._result_concepts.add(concept)
        for common, folded in _FOLDED.items():
            concepts.setdefault(common, set(folded))
        # longest phrase first: "invoice date" is named before "date", "total due" before "total"
        self._phrases = sorted(((p, c) for c, ps in concepts.items() for p in ps if p), key=lambda pc: -len(pc[0]))
        self._nearest_of: dict[str, tuple[int, str] | None] = {}

    def _nearest(self, label: str) -> tuple[int, str] | None:
        """Where the phrase nearest the value ends in ``label`` folded, and the concept it names: of the phrases
        that end last (a line may hold two labels: "Invoice date: ... Due date:"), the longest. Once a label."""
        if label not in self._nearest_of:
            text = f" {fold(label)} "
            best: tuple[int, int, str] | None = None
            for phrase, concept in self._phrases:
                at = text.rfind(f" {phrase} ")
                if at >= 0 and (best is None or (at + len(phrase), len(phrase)) > best[:2]):
                    best = (at + len(phrase), len(phrase), concept)
            self._nearest_of[label] = None if best is None else (best[0], best[2])
        return self._nearest_of[label]

    def named(self, label: str) -> str | None:
        """The concept ``label`` names -- its phrase nearest the value, as whole words -- or None."""
        nearest = self._nearest(label)
        return None if nearest is None else nearest[1]

    def elsewhere(self, path: str, label: str) -> str | None:
        """The other field ``label`` names, when it names one and none of ``path``'s own phrases ends as near the
        value (``Due date: X   Invoice date:`` before a value names the invoice date, not the due date): a field
        of the result, or -- for a field that is itself a common one (``SYNONYMS``) -- another common field (a
        total under "Subtotal:"). A label naming a common field says nothing of a field of another kind."""
        nearest, own = self._nearest(label), self._own.get(path)
        if nearest is None or own is None or nearest[1] == own[0]:
            return None
        end, named = nearest
        if named not in self._result_concepts and own[0] not in SYNONYMS:
            return None
        text = f" {fold(label)} "
        if any((at := text.rfind(f" {phrase} ")) >= 0 and at + len(phrase) >= end for phrase in own[1]):
            return None  # "Invoice date" for a field named date: its own word ends the label too
        return named


__all__ = ["MAX_LABEL_CHARS", "SYNONYMS", "fold", "label_before", "FieldNames"]
