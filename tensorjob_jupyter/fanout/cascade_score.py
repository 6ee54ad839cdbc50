"""A cascade's item score: one number per item, from what its proxy answer recorded; higher is surer.

Each definition reads an item's results record -- ``confidence`` (each field's, 0 to 1) and ``sources`` (where
each was found: ``grounded.FIELD``) -- over the fields the model answered (those with a confidence), or only the
ones named (``--cascade-on vendor,total``: a name is a field's path, its last parts, or a field above it). The
weakest field decides (not a product, which punishes long values); an item with nothing to score has None and
always goes to the oracle. Which definition separates right answers from wrong ones best is measured by AUROC
(``bench/bench_cascade.py``); the guarantee holds whichever is used (``cascade_bound``).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from tensorjob_jupyter.host.fields import split_path
from tensorjob_jupyter.host.grounding import grounds

__all__ = ["DEFINITIONS", "DEFAULT_SCORE", "check_definition", "parse_fields", "matches", "answered_fields",
           "item_score"]


def _min(confidences: list[float], grounded: list[bool | None]) -> float | None:
    return min(confidences) if confidences else None


def _min_grounded(confidences: list[float], grounded: list[bool | None]) -> float | None:
    if not confidences:
        return None
    return min(confidences) - (1.0 if any(g is False for g in grounded) else 0.0)


def _mean(confidences: list[float], grounded: list[bool | None]) -> float | None:
    return sum(confidences) / len(confidences) if confidences else None


def _product(confidences: list[float], grounded: list[bool | None]) -> float | None:
    return math.prod(confidences) if confidences else None


def _grounded_share(confidences: list[float], grounded: list[bool | None]) -> float | None:
    located = [g for g in grounded if g is not None]
    return sum(located) / len(located) if located else None


#: Each score by name: (confidences, groundings) of the item's chosen fields -> its score, or None.
DEFINITIONS: dict[str, Callable[[list[float], list[bool | None]], float | None]] = {
    "min_confidence_grounded": _min_grounded,  # the weakest field's confidence, less 1 if any field is ungrounded
    "min_confidence": _min,                    # the weakest field's confidence
    "mean_confidence": _mean,                  # the fields' mean confidence
    "product_confidence": _product,            # the product: what a sequence's probability is (for comparison)
    "grounded_share": _grounded_share,         # the share of fields grounded (needs no logprobs)
}
DEFAULT_SCORE = "min_confidence_grounded"


def check_definition(name: Any) -> str:
    """A definition's name, checked; ``ValueError`` (one line) names the ones there are."""
    if name not in DEFINITIONS:
        raise ValueError(f"--cascade-score {name!r}: not a score; the scores are {', '.join(DEFINITIONS)}")
    return name


def parse_fields(text: "str | Sequence[str] | None") -> tuple[str, ...]:
    """``"vendor,total"`` (or a list of such) as field names, in order, each once; ``()`` for none."""
    if text is None:
        return ()
    parts = [text] if isinstance(text, str) else list(text)
    names = [name.strip() for part in parts for name in str(part).split(",")]
    return tuple(dict.fromkeys(name for name in names if name))


def matches(path: str, names: Sequence[str]) -> bool:
    """Whether the field ``path`` is one of ``names``: the path itself, its last parts (``vendor`` is
    ``facts.vendor``'s), or a field above it (``facts`` names every field in it)."""
    if not names:
        return True
    parts = split_path(path)
    for name in names:
        want = split_path(name)
        n = len(want)
        if parts[-n:] == want or parts[:n] == want:
            return True
    return False


def answered_fields(confidence: dict[str, float | None] | None, names: Sequence[str] = ()) -> list[str]:
    """The fields of an item's record the model answered (a confidence recorded), among ``names`` if given."""
    return [path for path, value in (confidence or {}).items() if value is not None and matches(path, names)]


def item_score(confidence: dict[str, float | None] | None, sources: dict[str, list] | None,
               definition: str = DEFAULT_SCORE, names: Sequence[str] = ()) -> float | None:
    """One item's score by ``definition`` from its record's ``confidence`` and ``sources`` (read back as
    ``progress.record_confidence``/``record_sources`` give them), over the fields ``names`` picks; None when
    none of them has anything to score by (a failed item, a model without logprobs)."""
    fields = answered_fields(confidence, names)
    if definition == "grounded_share" and not fields:  # grounding alone needs no confidence
        fields = [path for path in (sources or {}) if matches(path, names)]
    values = [float(v) for path in fields if confidence and (v := confidence.get(path)) is not None]
    grounded = [grounds((sources or {}).get(path)) if sources is not None else None for path in fields]
    return DEFINITIONS[check_definition(definition)](values, grounded)
