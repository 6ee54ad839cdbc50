"""A map's and a replay's own flags, written once: one table that ``tensorjob map``/``replay`` and the magic read.

Each ``Flag`` row is a flag with its dest, type and default, and its help by where it belongs (``MAP``, ``REPLAY``,
``REPLAY_MAP``: ``replay --map RUN_DIR``, ``REPLAY_MAP_LIVE``); the keys of its help are where it belongs, so the
two doors cannot drift. ``add_arguments(parser, command)`` puts a command's rows on an argparse parser (help named
by where it belongs when that is not the command itself); ``magic_flags()`` puts every row on ``%tensorjob``'s one
parser, each help prefixed by where it belongs. ``check_placed`` refuses a flag given where it does not belong
(``--run-dir`` on a replay without ``--map``), ``check_required`` names what a map needs: both doors call them.
``map_spec`` and ``map_replay_spec`` read a map's and a replay's flags into their one checked value for both
doors. The job options are ``options.py``'s table.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from tensorjob_jupyter.abi import OptionError
import tensorjob_jupyter as tj
from tensorjob_jupyter.fanout.map_spec import AGAINST
from tensorjob_jupyter.fanout.cascade_score import DEFAULT_SCORE, DEFINITIONS
from tensorjob_jupyter.fanout.scoring import BUILTINS, DEFAULT_SCORER
from tensorjob_jupyter.frontends.options import concurrency_value
from tensorjob_jupyter.frontends import requests

#: Where a flag belongs: ``tensorjob map``; ``tensorjob replay`` either way (``--from RUN`` or ``--map RUN_DIR``);
#: a replay of a map only; a live replay of a map only (the map's replay checks ``--live`` itself).
MAP, REPLAY, REPLAY_MAP, REPLAY_MAP_LIVE = "map", "replay", "replay --map RUN_DIR", "replay --map RUN_DIR --live"


@dataclass(frozen=True)
class Flag:
    """One row: a flag, read the same by every door; ``help`` says, by where it belongs, what it does there."""

    flag: str
    help: dict[str, str] = field(hash=False)  # {MAP: "...", REPLAY_MAP: "..."}: its keys are where it belongs
    dest: str = ""  # default: the flag's name (--run-dir: run_dir)
    metavar: str | None = None
    type: Callable[[str], Any] | None = None
    switch: bool = False  # a flag with no value (store_true)
    default: Any = None
    choices: tuple[str, ...] | None = None
    required: tuple[str, ...] = ()  # where it must be given (argparse's required=True on that command's parser)

    @property
    def name(self) -> str:
        """The namespace attribute it sets."""
        return self.dest or self.flag.lstrip("-").replace("-", "_")

    @property
    def where(self) -> tuple[str, ...]:
        """Where it belongs (``MAP``, ``REPLAY_MAP``, ...): its help's keys."""
        return tuple(self.help)

    def help_for(self, command: str | None) -> str:
        """The help on ``command``'s parser (None: the magic's one parser for every action): each text but the
        command's own is prefixed by where it belongs (``replay --map: ...``)."""
        return "; ".join(text if where == command else f"{where.replace(' RUN_DIR', '')}: {text}"
                         for where, text in self.help.items() if command is None or where.split()[0] == command)

    def keywords(self, command: str | None) -> dict[str, Any]:
        """``add_argument``'s keywords on ``command``'s parser (None: the magic's)."""
        out: dict[str, Any] = dict(dest=self.name, default=self.default, help=self.help_for(command))
        if self.switch:
            return {**out, "action": "store_true"}
        out.update(metavar=self.metavar, type=self.type, choices=self.choices)
        if command is not None and command in self.required:
            out["required"] = True
        return out


#: A map's own flags (some a map's replay takes too).
MAP_FLAGS: tuple[Flag, ...] = (
    Flag("--over", {MAP: "the items: a JSONL file, one input a line"}, metavar="MANIFEST", required=(MAP,)),
    Flag("--run-dir", {MAP: "where results.jsonl, failures.jsonl and the ledger go; rerun to resume",
                       REPLAY_MAP: "the replay's own run folder, started over (default: the map's RUN_DIR/replay)"},
         metavar="DIR", required=(MAP,)),
    Flag("--concurrency", {MAP: "items at once: a number, or auto (the default: as many as the model decodes "
                                "together -- its slots, 4 unless set -- at most twice the physical cores); on a "
                                "cluster, items in flight (default twice its threads)",
                           REPLAY_MAP: "items replayed at once (default, or auto: the CPUs this process may use)"},
         metavar="N|auto", type=concurrency_value),
    Flag("--cluster", {MAP: "run items on this Dask scheduler"}, metavar="ADDRESS"),
    Flag("--retry-failed", {MAP: "on resume, run the failed items again"}, switch=True, default=False),
    Flag("--restart", {MAP: "start the run folder over, keeping nothing it holds (e.g. after changing the guest)"},
         switch=True, default=False),
    Flag("--expected", {MAP: "expected answers, one JSON value a line in the manifest's order: score every item",
                        REPLAY_MAP: "score against these expected answers (default: the recorded map's)"},
         metavar="FILE.jsonl"),
    Flag("--scorer", {MAP: f"how an answer is scored against its expected one: {', '.join(BUILTINS)} (default "
                           f"{DEFAULT_SCORER}; in a notebook also $name, a Python function (result, expected) -> "
                           f"score)",
                      REPLAY_MAP: f"how an answer is scored: {', '.join(BUILTINS)}, or in a notebook $name (default: "
                                  f"the recorded map's)"}, metavar="NAME"),
    Flag("--max-total-tokens", {MAP: "stop the map, resumably, once its items have used N tokens (in and out)"},
         metavar="N", type=int),
    Flag("--estimate", {MAP: "what the map would cost (prompt tokens per item, the expected time); runs nothing"},
         switch=True, default=False),
    Flag("--deterministic", {MAP: "answers that do not depend on what else runs: one item at a time, each infer "
                                  "decoded alone with a fixed thread count and no prompt cache (slower; a local "
                                  "model only)",
                             REPLAY_MAP_LIVE: "one item at a time, each live infer decoded alone with a fixed "
                                              "thread count and no prompt cache, so its answer does not depend on "
                                              "what else runs"},
         switch=True, default=False),
)

#: A map's cascade (``--cascade`` and its settings) and ``--mixed-models``: what ``cascade_keywords`` reads.
CASCADE_FLAGS: tuple[Flag, ...] = (
    Flag("--cascade", {MAP: "a bigger model (a GGUF path, hf:..., a served URL) that answers only the items whose "
                            "proxy score is under a threshold certified from a sample: the answers agree with what "
                            "MODEL alone would say on at least --target of the items, with probability 1 - --delta"},
         metavar="MODEL"),
    Flag("--target", {MAP: "with --cascade: the share of items that must agree with the oracle (default 0.9)"},
         dest="cascade_target", metavar="X", type=float),
    Flag("--delta", {MAP: "with --cascade: the chance the guarantee may fail (default 0.1)"},
         dest="cascade_delta", metavar="D", type=float),
    Flag("--cascade-on", {MAP: "with --cascade: the fields the proxy score and the agreement read, e.g. "
                               "vendor,total (default: every field the model answered)"}, metavar="FIELDS"),
    Flag("--cascade-score", {MAP: f"with --cascade: the proxy score, one of {', '.join(DEFINITIONS)} "
                                  f"(default {DEFAULT_SCORE})"}, metavar="NAME"),
    Flag("--cascade-sample", {MAP: "with --cascade: the items sampled for the oracle (default: five times what the "
                                   "bound needs, or a tenth of the items)"}, metavar="N", type=int),
    Flag("--target-against", {MAP: "with --cascade: what the target is measured against: the oracle's answers "
                                   "(default) or expected's (--expected)"}, choices=tuple(AGAINST)),
    Flag("--mixed-models", {MAP: "resume (or --retry-failed) a run folder another model mapped, each row naming its "
                                 "model; refused without it"}, switch=True),
)

#: A replay's own flags, and what only a map's replay takes.
REPLAY_FLAGS: tuple[Flag, ...] = (
    Flag("--from", {REPLAY: "the recorded run: an id (or a unique prefix), a run folder, or in a notebook $name"},
         dest="from_run", metavar="RUN"),
    Flag("--map", {REPLAY: "instead of --from: a recorded map's run folder (or in a notebook $name); every item is "
                           "replayed against its own recording, and the items whose prompts changed are listed "
                           "(--live: run only those)"}, dest="map_run", metavar="RUN_DIR"),
    Flag("--live", {REPLAY: "from the first divergence on, run the model"}, switch=True, default=False),
    Flag("--recorded-grants", {REPLAY: "with --live: read and fetch under the recorded run's grants (a replay "
                                       "otherwise reads only what --read grants now, and fetches only what --fetch "
                                       "grants: a transcript's grants never widen it unasked)"},
         switch=True, default=False),
    Flag("--fail-under", {REPLAY_MAP: "fail (exit 1; in a notebook raise GateFailed) unless the new mean score is "
                                      "at least X (0 to 1), or the recorded map's ('recorded'), and every item was "
                                      "answered from its recording"}, metavar="X"),
    Flag("--rerun", {REPLAY_MAP_LIVE: "run every item on the model from its start, those whose prompts did not "
                                      "change too (else they come from their recordings)"},
         switch=True, default=False),
)

#: Every row, each once.
FLAGS: tuple[Flag, ...] = MAP_FLAGS + CASCADE_FLAGS + REPLAY_FLAGS
BY_FLAG: dict[str, Flag] = {f.flag: f for f in FLAGS}


def of_command(command: str, flags: Iterable[Flag] = FLAGS) -> tuple[Flag, ...]:
    """The rows ``tensorjob COMMAND`` takes (``map`` or ``replay``), the command's own first (``--from``, then a
    map's replay's ``--run-dir``)."""
    rows = [f for f in flags if any(where.split()[0] == command for where in f.where)]
    return tuple(sorted(rows, key=lambda f: command not in f.where))


def add_arguments(parser, command: str, flags: Iterable[Flag] = FLAGS) -> None:
    """Put ``command``'s rows of ``flags`` (default: the whole table) on an argparse parser or group."""
    for f in of_command(command, flags):
        parser.add_argument(f.flag, **f.keywords(command))


def magic_flags(flags: Iterable[Flag] = FLAGS):
    """A ``magic_arguments`` decorator putting every row of ``flags`` on a magic (whose one parser serves every
    action: each help says where the flag belongs)."""
    from IPython.core.magic_arguments import ArgDecorator

    rows = tuple(flags)

    class _Flags(ArgDecorator):
        def add_to_parser(self, parser, group):
            for f in rows:
                (group if group is not None else parser).add_argument(f.flag, **f.keywords(None))

    return _Flags()


def _given(args: argparse.Namespace, f: Flag) -> bool:
    return getattr(args, f.name, f.default) is not f.default


def check_placed(args: argparse.Namespace, command: str) -> None:
    """Refuse (``OptionError``) a row's flag given on ``command`` (``map``, ``replay``, or the magic's other
    actions) where it does not belong: a replay without ``--map`` takes no flag of a map's replay."""
    here = {MAP} if command == MAP else set()
    if command == REPLAY:
        here = {REPLAY, REPLAY_MAP, REPLAY_MAP_LIVE} if getattr(args, "map_run", None) is not None else {REPLAY}
    for f in FLAGS:
        if _given(args, f) and not here & set(f.where):
            same = [where for where in f.where if where.split()[0] == command]  # the command's own use, if any
            raise OptionError(f"{f.flag} is for {' or '.join(same or f.where)}")


def check_required(args: argparse.Namespace, command: str) -> None:
    """Refuse ``command`` (``map``) without each flag it must be given: one line naming them all."""
    needed = [f for f in FLAGS if command in f.required]
    if any(not getattr(args, f.name, None) for f in needed):  # an empty --over names no manifest either
        raise OptionError(f"{command} needs " + " and ".join(f"{f.flag} {f.metavar}" for f in needed))


def map_spec(args: argparse.Namespace, *, scorer: Any = None) -> tj.MapSpec:
    """The map the table's map flags describe, as either door read them (one function: the two cannot drift), as
    one checked ``MapSpec``; ``scorer``: a notebook's function, in place of ``--scorer``."""
    return requests.map_spec(args.over, args.run_dir, concurrency=args.concurrency, cluster=args.cluster,
                             retry_failed=args.retry_failed, restart=args.restart, expected=args.expected,
                             scorer=scorer if scorer is not None else args.scorer,
                             max_total_tokens=args.max_total_tokens, deterministic=args.deterministic,
                             **cascade_keywords(args))


def cascade_keywords(args: argparse.Namespace) -> dict:
    """``MapSpec.of``'s cascade keywords (and ``mixed_models``) from the flags of ``CASCADE_FLAGS``, as given."""
    return dict(cascade=args.cascade, target=args.cascade_target, delta=args.cascade_delta, cascade_on=args.cascade_on,
                cascade_score=args.cascade_score, cascade_sample=args.cascade_sample,
                target_against=args.target_against, mixed_models=bool(args.mixed_models))


def map_replay_spec(args: argparse.Namespace, *, run: Any = None, scorer: Any = None) -> tj.MapReplaySpec:
    """The replay of a recorded map the table's replay flags describe, as either door read them, as one checked
    ``MapReplaySpec``; ``run``: the recorded map (a notebook's ``$name`` resolved), else ``--map``'s folder;
    ``scorer``: a notebook's function, in place of ``--scorer``."""
    return requests.map_replay_spec(
        run if run is not None else args.map_run, out=args.run_dir, live=bool(args.live),
        recorded_grants=bool(args.recorded_grants), concurrency=args.concurrency, expected=args.expected,
        scorer=scorer if scorer is not None else args.scorer, deterministic=bool(args.deterministic),
        rerun=bool(args.rerun))


__all__ = [
    "MAP", "REPLAY", "REPLAY_MAP", "REPLAY_MAP_LIVE", "Flag", "MAP_FLAGS", "CASCADE_FLAGS", "REPLAY_FLAGS", "FLAGS",
    "BY_FLAG", "of_command", "add_arguments", "magic_flags", "check_placed", "check_required", "map_spec",
    "cascade_keywords", "map_replay_spec",
]
