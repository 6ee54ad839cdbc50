"""A map as two values: ``tj.map(spec, map_spec)`` runs the map the keyword form runs; ``MapSpec.of`` checks every
value once, before anything starts (nothing below checks again), and a cascade's oracle map is the same value with
its own folder and items. ``MapReplaySpec`` likewise for a replay over a recorded map."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tensorjob_jupyter as tj
from tensorjob_jupyter.fanout.map_spec import MapSpec
from tensorjob_jupyter.inference import ModelRef, ScriptedBackend
from test_map import MIXED, puppet_guest, write_manifest


@pytest.fixture(scope="module")
def guest():
    return puppet_guest()


def test_the_value_form_runs_the_map_the_keyword_form_runs(guest, tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", MIXED)
    by_keywords = tj.map(guest, manifest, tmp_path / "a", backend=ScriptedBackend("a b c"), concurrency=2)
    spec = tj.JobSpec.of(guest)
    map_spec = tj.MapSpec.of(manifest, tmp_path / "b", concurrency=2)
    by_values = tj.map(spec, map_spec, backend=ScriptedBackend("a b c"))
    assert (by_values.total, by_values.completed, by_values.failed) == (by_keywords.total, by_keywords.completed,
                                                                       by_keywords.failed) == (5, 3, 2)
    assert by_values.results_path.read_text() == by_keywords.results_path.read_text()
    ledger = json.loads((tmp_path / "b" / "ledger.json").read_text())
    assert ledger["manifest"]["sha256"] == map_spec.manifest.sha256  # the manifest read once, by the spec


def test_a_map_spec_is_checked_when_built_and_holds_its_values_resolved(tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", MIXED)
    spec = MapSpec.of(manifest, "relative/run", concurrency="auto", max_total_tokens=10)
    assert spec.run_dir == os.path.abspath("relative/run") and not os.path.exists(spec.run_dir)
    assert len(spec.manifest) == 5 and spec.concurrency == "auto" and spec.max_total_tokens == 10
    for keywords, says in [
        (dict(concurrency=0), "concurrency must be a whole number at least 1"),
        (dict(max_total_tokens=0), r"--max-total-tokens \(max_total_tokens=\) must be a whole number of at least 1"),
        (dict(target=0.9), "--target goes with --cascade MODEL"),
        (dict(cascade=ModelRef(), target=1.5), "target"),
        (dict(cascade=ModelRef(), delta=0), "delta"),
        (dict(cascade=ModelRef(), target_against="both"), "--target-against 'both'"),
        (dict(cascade=ModelRef(), target_against="expected"), "needs expected answers"),
        (dict(cascade=ModelRef(), cascade_sample=0), "--cascade-sample 0"),
        (dict(cascade=3), "--cascade: a model"),
    ]:
        with pytest.raises(ValueError, match=says):
            MapSpec.of(manifest, tmp_path / "run", **keywords)
    with pytest.raises(tj.ScoringError):
        MapSpec.of(manifest, tmp_path / "run", scorer="no-such-scorer")
    with pytest.raises(tj.ManifestError):
        MapSpec.of(tmp_path / "missing.jsonl", tmp_path / "run")
    assert not (tmp_path / "run").exists()  # nothing started


def test_what_cannot_go_with_a_deterministic_map_is_refused_when_the_spec_is_built(tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", MIXED)
    for keywords, says in [(dict(cluster="tcp://127.0.0.1:1"), "not on a cluster"),
                           (dict(concurrency=4), "concurrency=4 cannot go with it"),
                           (dict(cascade="http://127.0.0.1:1/v1"), "a served oracle")]:
        with pytest.raises(ValueError, match=says):
            MapSpec.of(manifest, tmp_path / "run", deterministic=True, **keywords)
    assert MapSpec.of(manifest, tmp_path / "run", deterministic=True, concurrency=1).deterministic


def test_a_spec_built_as_a_value_is_still_checked_before_a_map_starts(guest, tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", MIXED)
    spec = tj.JobSpec(guest=tj.JobSpec.of(guest).guest, read=("no-such-folder",), cwd=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="read grant not found: no-such-folder"):
        tj.start_map(spec, MapSpec.of(manifest, tmp_path / "run"), backend=ScriptedBackend("a"))
    assert not (tmp_path / "run").exists()
    for bad in ("", "a\0b"):
        with pytest.raises(ValueError, match="read grant"):
            tj.JobSpec.of(guest, read=[bad])  # "" would otherwise be the whole working folder


def test_an_estimate_takes_the_map_spec_too(guest, tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", [{"cmd": "done", "result": 1}] * 3)
    estimate = tj.estimate_map(tj.JobSpec.of(guest), MapSpec.of(manifest, tmp_path / "run"),
                               backend=ScriptedBackend("a"))
    assert estimate.items == 3


def test_the_two_forms_do_not_mix(guest, tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", MIXED)
    map_spec = MapSpec.of(manifest, tmp_path / "run")
    with pytest.raises(TypeError, match="takes a MapSpec, or a manifest, a run folder and keywords, not both"):
        tj.start_map(tj.JobSpec.of(guest), map_spec, concurrency=2)
    with pytest.raises(TypeError, match="needs a run folder"):
        tj.start_map(guest, manifest)
    with pytest.raises(TypeError, match="a JobSpec, or a guest and keywords, not both"):
        tj.start_map(tj.JobSpec.of(guest), manifest, tmp_path / "run", max_tokens=3)


def test_a_cascades_oracle_map_is_the_same_spec_with_its_own_folder_and_items(tmp_path):
    manifest = write_manifest(tmp_path / "m.jsonl", MIXED)
    spec = MapSpec.of(manifest, tmp_path / "run", concurrency=2, expected=[None] * 5, scorer="exact",
                      max_total_tokens=50, cascade=ModelRef(), target=0.8, delta=0.2,
                      withhold=[(str(tmp_path / "secret"), "a folder of the caller's")])
    oracle = spec.oracle(tmp_path / "run" / "oracle", frozenset({1, 3}), restart=True, withheld=spec.run_dir)
    assert oracle.manifest is spec.manifest and oracle.concurrency == 2 and oracle.only == {1, 3}
    assert (oracle.cascade, oracle.expected, oracle.scorer, oracle.max_total_tokens) == (None, None, None, None)
    assert oracle.withhold == ((str(tmp_path / "secret"), "a folder of the caller's"),
                               (spec.run_dir, "the cascade's run folder")) and oracle.restart
    assert spec.cascade is not None and (spec.cascade.target, spec.cascade.delta) == (0.8, 0.2)


@settings(max_examples=60, deadline=None)
@given(concurrency=st.one_of(st.none(), st.just("auto"), st.integers(-3, 5), st.booleans(), st.text(max_size=3)),
       live=st.booleans(), rerun=st.booleans(), deterministic=st.booleans())
def test_a_map_replay_spec_is_built_checked_or_refused_by_name(tmp_path_factory, concurrency, live, rerun,
                                                                deterministic):
    try:
        spec = tj.MapReplaySpec.of("runs/m", live=live, rerun=rerun, deterministic=deterministic,
                                   concurrency=concurrency)
    except ValueError as e:
        said = str(e)
        assert ("rerun goes with live" in said or "concurrency" in said
                or "deterministic goes with live" in said), said
        return
    assert live or not rerun
    assert spec.concurrency is None or (isinstance(spec.concurrency, int) and spec.concurrency >= 1)
    if deterministic:
        assert live and spec.concurrency == 1
