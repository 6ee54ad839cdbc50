"""``MapSpec``: everything that shapes a map but its items' job, as one checked value; ``CascadeSpec`` its cascade.

A map is a ``JobSpec`` (every item's job but for its input) and a ``MapSpec``: the manifest (read once, here), the
run folder, how many items at once and where, resume and restart, the expected answers and their scorer, the token
budget, whether it is deterministic, and the cascade, if any. ``MapSpec.of`` reads the Python API's keywords and
checks every one of them before anything starts -- a front end builds the same value from its flags -- so what
starts the map (``fanout.start``, ``fanout.cascade``) takes it as it is and checks nothing again. A cascade's
oracle map is the same value with its own folder and items (``MapSpec.oracle``). Both are frozen.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from tensorjob_jupyter.fanout.cascade_bound import check_delta, check_target, needed
from tensorjob_jupyter.fanout.cascade_score import DEFAULT_SCORE, check_definition, parse_fields
from tensorjob_jupyter.fanout.concurrency import AUTO, check_concurrency
from tensorjob_jupyter.fanout.manifest import Manifest, read_manifest
from tensorjob_jupyter.fanout.scoring import scorer_of
from tensorjob_jupyter.inference.providers import ModelRef

#: What a cascade's target is measured against: the oracle's answers, or the expected answers (``--expected``).
AGAINST = ("oracle", "expected")
DEFAULT_TARGET, DEFAULT_DELTA = 0.9, 0.1
#: ``MapSpec.of``'s keywords for a cascade: each goes with ``cascade`` (a model) and says how it chooses.
CASCADE_KEYWORDS = ("target", "delta", "cascade_on", "cascade_score", "cascade_sample", "target_against")


@dataclass(frozen=True)
class CascadeSpec:
    """How a cascade chooses (see ``fanout.cascade``): its oracle -- a ``ModelRef``, or a backend or a factory
    (``oracle_backend``) -- the target and delta of its guarantee, the fields its score reads, the score's
    definition, the sample's size (None: chosen from the target) and what the target is measured against."""

    oracle: ModelRef | None = None
    oracle_backend: Any = None
    target: float = DEFAULT_TARGET
    delta: float = DEFAULT_DELTA
    fields: tuple[str, ...] = ()
    score: str = DEFAULT_SCORE
    sample: int | None = None
    against: str = "oracle"


@dataclass(frozen=True)
class MapSpec:
    """A map's setup but its job (see the module doc); ``MapSpec.of`` builds one from the Python API's keywords."""

    #: the items, read and hashed (``fanout.manifest``)
    manifest: Manifest
    #: the run folder, absolute
    run_dir: str
    #: items at once locally, or in flight on a cluster: a whole number, or ``"auto"``
    concurrency: int | str = AUTO
    #: None (this process), a scheduler address, a ``distributed.Client`` or a Dask cluster object
    cluster: Any = None
    retry_failed: bool = False
    restart: bool = False
    #: Dask retries of an item whose task raised
    retries: int = 1
    fsync: bool = True
    #: expected answers (a JSONL file, a list in item order or a dict by key) and their scorer (a built-in's
    #: name or a function); read against the items when the map starts (``Scoring.of``)
    expected: Any = None
    scorer: Any = None
    max_total_tokens: int | None = None
    deterministic: bool = False
    mixed_models: bool = False
    cascade: CascadeSpec | None = None
    #: only these items run (a cascade's oracle phases); None: every item
    only: frozenset[int] | None = None
    #: folders withheld from every item's grants besides the map's own, ``(path, what)``
    withhold: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, manifest: "str | os.PathLike | Sequence[Any] | Manifest", run_dir: str | os.PathLike, *,
           concurrency: int | str | None = None, cluster: Any = None, retry_failed: bool = False,
           restart: bool = False, retries: int = 1, fsync: bool = True, expected: Any = None, scorer: Any = None,
           max_total_tokens: int | None = None, deterministic: bool = False, mixed_models: bool = False,
           cascade: Any = None, target: float | None = None, delta: float | None = None, cascade_on: Any = None,
           cascade_score: str | None = None, cascade_sample: int | None = None, target_against: str | None = None,
           only: "frozenset[int] | None" = None, withhold: Sequence[tuple[str, str]] = ()) -> "MapSpec":
        """The spec the keywords describe (each is ``start_map``'s of the same name), every one checked:
        ``ValueError`` for a bad number or cascade setting, ``ManifestError`` for the manifest, ``ScoringError``
        for an unknown scorer -- all before anything runs."""
        settings = {"target": target, "delta": delta, "cascade_on": cascade_on, "cascade_score": cascade_score,
                    "cascade_sample": cascade_sample, "target_against": target_against}
        if cascade is None:
            given = [k.replace("_", "-") for k, v in settings.items() if v is not None]
            if given:
                raise ValueError(f"--{given[0]} goes with --cascade MODEL (cascade=): it says how the cascade "
                                 f"chooses")
        chosen = (_cascade_spec(cascade, cluster=cluster, expected=expected, run_dir=run_dir, **settings)
                  if cascade is not None else None)
        items = read_manifest(manifest)
        if chosen is not None:
            _check_sample(chosen, len(items))
        if max_total_tokens is not None and (isinstance(max_total_tokens, bool) or not isinstance(max_total_tokens, int)
                                             or max_total_tokens < 1):
            raise ValueError(f"--max-total-tokens (max_total_tokens=) must be a whole number of at least 1, got "
                             f"{max_total_tokens!r}")
        width = check_concurrency(concurrency)
        if deterministic:
            _check_deterministic(cluster, width, chosen)
        if scorer is not None and not callable(scorer):
            scorer_of(scorer)  # an unknown name is a ScoringError here, before anything starts
        return cls(manifest=items, run_dir=str(Path(run_dir).absolute()), concurrency=width,
                   cluster=cluster, retry_failed=bool(retry_failed), restart=bool(restart), retries=int(retries),
                   fsync=bool(fsync), expected=expected, scorer=scorer, max_total_tokens=max_total_tokens,
                   deterministic=bool(deterministic), mixed_models=bool(mixed_models), cascade=chosen,
                   only=only, withhold=tuple((str(p), str(w)) for p, w in withhold))

    def replace(self, **changes: Any) -> "MapSpec":
        """A copy with ``changes`` (fields of this class), taken as they are."""
        return dataclasses.replace(self, **changes)

    def oracle(self, run_dir: str | os.PathLike, only: frozenset[int], *, restart: bool, withheld: str) -> "MapSpec":
        """A cascade's oracle map of these items: into ``run_dir``, only the items ``only``, with the cascade's own
        folder (``withheld``) withheld from its grants; no scoring, budget or cascade of its own."""
        return self.replace(run_dir=str(Path(run_dir).absolute()), only=only, restart=restart, expected=None,
                            scorer=None, max_total_tokens=None, mixed_models=False, cascade=None,
                            withhold=(*self.withhold, (withheld, "the cascade's run folder")))


def _cascade_spec(cascade: Any, *, cluster: Any, expected: Any, run_dir: str | os.PathLike, target: Any,
                  delta: Any, cascade_on: Any, cascade_score: Any, cascade_sample: Any,
                  target_against: Any) -> CascadeSpec:
    """The cascade the keywords describe, checked (see ``MapSpec.of``)."""
    target = check_target(DEFAULT_TARGET if target is None else target)
    delta = check_delta(DEFAULT_DELTA if delta is None else delta)
    score = check_definition(DEFAULT_SCORE if cascade_score is None else cascade_score)
    against = target_against or "oracle"
    if against not in AGAINST:
        raise ValueError(f"--target-against {against!r}: the oracle (its answers) or expected (--expected's)")
    if against == "expected" and expected is None and not os.path.lexists(Path(run_dir) / "expected.jsonl"):
        raise ValueError("--target-against expected needs expected answers (--expected FILE.jsonl, expected=)")
    fields = parse_fields(cascade_on)
    if cascade_sample is not None and (isinstance(cascade_sample, bool) or not isinstance(cascade_sample, int)
                                       or cascade_sample < 1):
        raise ValueError(f"--cascade-sample {cascade_sample!r}: a whole number of items, at least 1")
    ref, backend = _oracle(cascade)
    if ref is not None:
        try:
            ref.check(local=cluster is None)
        except ValueError as e:  # worded for --model: the oracle is --cascade's
            raise ValueError(f"--cascade: {str(e).removeprefix('--model ').removeprefix('--model: ')}") from None
    return CascadeSpec(oracle=ref, oracle_backend=backend, target=target, delta=delta, fields=fields, score=score,
                       sample=cascade_sample, against=against)


def _check_deterministic(cluster: Any, concurrency: Any, cascade: CascadeSpec | None) -> None:
    """What cannot go with a deterministic map (``fanout.start.deterministic_job``; its own model, a served one,
    is refused there, where the job's model is known), refused before anything runs."""
    if cluster is not None:
        raise ValueError("a deterministic map runs one item at a time in this process, not on a cluster")
    if concurrency not in (AUTO, 1):
        raise ValueError(f"a deterministic map runs one item at a time; concurrency={concurrency!r} cannot go "
                         f"with it")
    if cascade is not None and cascade.oracle is not None and cascade.oracle.served:
        raise ValueError("a deterministic map needs a local model: a served oracle (--cascade URL) batches requests "
                         "as its server decides")


def _check_sample(cascade: CascadeSpec, items: int) -> None:
    """A sample smaller than the bound needs (and than the map) is refused, naming the least it takes."""
    least = needed(cascade.target, cascade.delta)
    if cascade.sample is not None and least is not None and cascade.sample < least and cascade.sample < items:
        raise ValueError(f"--cascade-sample {cascade.sample}: the bound needs at least {least} sampled items for a "
                         f"target of {cascade.target:g} at delta {cascade.delta:g}")


def _oracle(cascade: Any) -> tuple[ModelRef | None, Any]:
    """The oracle as a reference (its job's ``model``: parsed here when the Python API names it by text), or as a
    backend or a factory (``start_map``'s ``backend``)."""
    if isinstance(cascade, ModelRef):
        return cascade, None
    if isinstance(cascade, (str, os.PathLike)):
        try:
            return ModelRef.parse(cascade), None
        except ValueError as e:
            raise ValueError(f"--cascade: {e}") from None
    if hasattr(cascade, "generate_stream") or callable(cascade):
        return None, cascade
    raise ValueError(f"--cascade: a model (a GGUF path, hf:..., a served URL) or a backend, not "
                     f"{type(cascade).__name__}")


__all__ = ["AGAINST", "DEFAULT_TARGET", "DEFAULT_DELTA", "CASCADE_KEYWORDS", "CascadeSpec", "MapSpec"]
