"""Job options, written once: one table, one value, one way onto a parser.

Every way to start a job -- the magics, the ``tensorjob`` commands and the Python API -- takes the same options
under the same names, checked the same way. ``OPTIONS`` is the table (the limits are rows made from ``Limits``
itself, so a new limit is a flag, a traitlet and a keyword with no other line written); ``add_job_arguments``
puts it on any argparse parser, the magics' included. ``JobOptions.from_args`` reads a parsed namespace once,
over defaults (the notebook's traitlets, or the built-in ones), and checks everything, or raises one
``OptionError`` naming the flag; the typed values a front end then hands to the public API are
``spec(guest)``/``map_spec(guest)`` (a ``JobSpec``) and ``overrides()`` (an ``Overrides``: only what was given,
for a replay). ``fail_under`` and ``concurrency_value`` read the two experiment options (a map's and a replay's
own flags are ``flags.py``'s table); ``EXIT_*`` are the commands' exit codes.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Mapping

from tensorjob_jupyter import limits as limits_table
from tensorjob_jupyter.abi import OptionError
from tensorjob_jupyter.fanout.concurrency import AUTO
from tensorjob_jupyter.limits import BYTES, COUNT, SECONDS, Limits
from tensorjob_jupyter.regular_file import open_regular
from tensorjob_jupyter.host.debugger import parse_break_on
from tensorjob_jupyter.host import (
    FetchGrants, GuestSource, InferOptions, JobSpec, ModelRef, Overrides, parse_fields,
)
from tensorjob_jupyter.frontends.input_value import InputError, read_input

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_CANCELLED = 0, 1, 2, 130


# --- reading an option's text ---------------------------------------------------------

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgG]i?[bB]?|[bB])?\s*$")
_SCALE = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def parse_bytes(text: str) -> int:
    """``4096``, ``64KiB``, ``1.5MiB``, ``2G``: a size in bytes (binary units)."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a size (e.g. 4096, 64KiB, 16MiB)")
    value = float(m.group(1)) * _SCALE[(m.group(2) or "")[:1].lower()]
    if not value.is_integer():
        raise ValueError(f"{text!r} is not a whole number of bytes")
    return int(value)


def _parse_limit(unit: str, text: str) -> Any:
    if text.strip().lower() in ("none", "off"):
        return None
    try:
        if unit == SECONDS:
            return float(text)
        if unit == BYTES:
            return parse_bytes(text)
        return int(text)
    except ValueError:
        what = {SECONDS: "a number of seconds", BYTES: "a size (e.g. 4096, 64KiB, 16MiB)"}.get(unit, "a whole number")
        raise OptionError(f"{text!r} is not {what}") from None


# --- the table --------------------------------------------------------------------------


@dataclass(frozen=True)
class Option:
    """One row of the table."""

    name: str  # the Python keyword and the JobOptions field
    flag: str
    help: str
    metavar: str | None = None
    kind: str = "text"  # text, path, paths, loras, names, fields, json, switch, onoff, float, int, flags, or a limit unit
    trait: str | None = None  # the TensorJob traitlet that gives its default, if any
    one_job: bool = False  # only where one job runs (a map's inputs come from its manifest)

    @property
    def is_limit(self) -> bool:
        return self.name in limits_table.FIELDS


OPTIONS: tuple[Option, ...] = (
    Option("read", "--read", "grant read access to a file or directory (repeatable)", "PATH", "paths"),
    Option("fetch", "--fetch", "let the guest fetch URLs under this http(s) prefix (repeatable)", "PREFIX",
           "paths"),
    Option("input", "--input", "the job input: a JSON value, or a Python literal such as \"{'path': 'a.txt'}\" "
           "(in a notebook also $name, a variable)", "JSON", "json", one_job=True),
    Option("input_file", "--input-file", "stage F's bytes for the guest's wasi:tensor read-input", "F", "path"),
    Option("model", "--model", "a GGUF model file, a Hugging Face model hf:ORG/REPO[:FILE_OR_QUANT] (from its "
           "cache, else downloaded), or the http(s)://HOST:PORT/v1 URL of an OpenAI-compatible server (vLLM, "
           "llama.cpp, Ollama, ...; default: the embedded SmolLM2-135M-Instruct)", "PATH|URL", "path",
           trait="model_path"),
    Option("model_name", "--model-name", "the model's id on a --model URL server (default: the server's only "
           "model)", "NAME", trait="model_name"),
    Option("api_key_env", "--api-key-env", "the environment variable holding the --model URL server's key "
           "(default OPENAI_API_KEY; the key is never recorded)", "VAR", trait="api_key_env"),
    Option("chat", "--chat", "apply the model's chat template to each prompt (--no-chat: send raw text; default: "
           "the template when the model has one)", kind="onoff", trait="chat"),
    Option("temperature", "--temperature", "sampling temperature (0: greedy)", "T", "float", trait="temperature"),
    Option("top_p", "--top-p", "sample among the likeliest tokens whose probabilities add up to P (1: all of them)",
           "P", "float", trait="top_p"),
    Option("repeat_penalty", "--repeat-penalty", "penalise tokens repeated from the last 64 (1: off)", "R", "float",
           trait="repeat_penalty"),
    Option("seed", "--seed", "sampling seed", "N", "int", trait="seed"),
    Option("lora", "--lora", "load a LoRA adapter (GGUF) and apply it to every infer at SCALE (default 1); "
           "repeatable", "NAME=PATH[:SCALE]", "loras", trait="lora"),
    Option("no_prompt_cache", "--no-prompt-cache", "evaluate every prompt afresh instead of reusing the KV cache of "
           "an earlier prompt with the same beginning", kind="switch", trait="no_prompt_cache"),
    Option("runs", "--runs", "where job transcripts go (default $TENSORJOB_RUNS or ~/.tensorjob/runs; a map's "
           "go under its run folder)", "DIR", trait="runs_dir"),
    Option("cflags", "--cflags", "extra flags for the C compiler (zig cc), as one argument: "
           "--cflags='-DN=4 -O2'", "FLAGS", "flags", trait="cflags"),
    Option("zigflags", "--zigflags", "extra flags for zig build-exe, as one argument: --zigflags='-O ReleaseFast'",
           "FLAGS", "flags", trait="zigflags"),
    Option("force", "--force", "compile again even if the guest is in the compile cache", kind="switch"),
    Option("debug", "--debug", "debug the guest: start paused before cf_init, then step one command at a time, "
           "to the next infer, or continue (the view's debug bar; Job.step(), .resume(), .pause())", kind="switch",
           one_job=True),
    Option("break_on", "--break-on", "pause when the guest returns one of these commands, before the host "
           "carries it out: comma-separated, e.g. infer,open,emit (fail: also before any other failure is final)",
           "CMDS", "names", one_job=True),
    Option("require_grounded", "--require-grounded", "reject each of these result fields that is not grounded in "
           "a window the job read (null in final.FIELD, why in rejected.FIELD; the rest of the result stays): "
           "comma-separated dotted paths, e.g. title,facts.year (an object or array: every field in it); a null "
           "is not rejected; repeatable", "FIELDS", "fields"),
    Option("require_present", "--require-present", "fail the job (code ungrounded) when one of these result fields "
           "is missing or null: comma-separated dotted paths; repeatable", "FIELDS", "fields"),
    Option("fail_item", "--fail-item", "with --require-grounded: fail the whole job (code ungrounded) on the first "
           "field that is not grounded, instead of rejecting that field alone", kind="switch"),
) + tuple(
    Option(name, f.metadata["flag"] or "--" + name.replace("_", "-"), f.metadata["help"],
           {SECONDS: "S", BYTES: "BYTES", COUNT: "N"}[f.metadata["unit"]], f.metadata["unit"], trait=name)
    for name, f in limits_table.FIELDS.items()
)
BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}


def add_job_arguments(parser, *, one_job: bool = True) -> None:
    """Add every job option to an argparse parser (or group). ``one_job=False``
    leaves out what a map takes from its manifest (``--input``)."""
    groups = {False: parser, True: parser}
    if hasattr(parser, "add_argument_group"):
        groups[True] = parser.add_argument_group("limits", "bounds of the job (Limits fields; sizes take KiB, MiB, GiB)")
    for opt in OPTIONS:
        if opt.one_job and not one_job:
            continue
        target = groups[opt.is_limit]
        if opt.kind == "switch":
            target.add_argument(opt.flag, dest=opt.name, action="store_true", default=None, help=opt.help)
        elif opt.kind == "onoff":
            target.add_argument(opt.flag, dest=opt.name, action=argparse.BooleanOptionalAction, default=None,
                                help=opt.help)
        elif opt.kind in ("paths", "loras", "names", "fields"):
            target.add_argument(opt.flag, dest=opt.name, action="append", default=None, metavar=opt.metavar,
                                help=opt.help)
        else:
            target.add_argument(opt.flag, dest=opt.name, default=None, metavar=opt.metavar, help=opt.help)


def job_arguments(one_job: bool = True):
    """A ``magic_arguments`` decorator adding every job option to a magic."""
    from IPython.core.magic_arguments import ArgDecorator

    class _JobArguments(ArgDecorator):
        def add_to_parser(self, parser, group):
            add_job_arguments(group if group is not None else parser, one_job=one_job)

    return _JobArguments()


def traitlets() -> dict[str, Any]:
    """A configurable traitlet for every option that has one, named by ``Option.trait``."""
    from traitlets import Bool, Float, Int, List, Unicode

    defaults = JobOptions()
    out: dict[str, Any] = {}
    for opt in OPTIONS:
        if opt.trait is None:
            continue
        trait: Any
        if opt.is_limit:
            default = getattr(defaults.limits, opt.name)
            optional = opt.name in limits_table.OPTIONAL
            if opt.kind == SECONDS:
                trait = Float(default, allow_none=True, help=opt.help) if optional else Float(default, help=opt.help)
            else:
                trait = Int(default, allow_none=True, help=opt.help) if optional else Int(default, help=opt.help)
        elif opt.kind == "switch":
            trait = Bool(False, help=opt.help)
        elif opt.kind == "onoff":
            trait = Bool(None, allow_none=True, help=opt.help + " (None: the default)")
        elif opt.kind == "loras":
            trait = List(Unicode(), help=opt.help)
        elif opt.kind == "float":
            trait = Float(getattr(defaults, opt.name), help=opt.help)
        elif opt.kind == "int":
            trait = Int(getattr(defaults, opt.name), help=opt.help)
        else:
            trait = Unicode("", help=opt.help + " (empty: the default)")
        out[opt.trait] = trait.tag(config=True)
    return out


# --- the value ----------------------------------------------------------------------------


@dataclass(frozen=True)
class JobOptions:
    """Everything that shapes a job besides its guest, checked."""

    read: tuple[str, ...] = ()
    fetch: tuple[str, ...] = ()
    input: Any = None
    input_file: str | None = None
    model: str | None = None
    model_name: str | None = None  # a served model's id (--model URL)
    api_key_env: str | None = None  # the variable holding a served model's key (--model URL)
    chat: bool | None = None  # None: the model's chat template when it has one
    temperature: float = 0.0
    top_p: float = 1.0
    repeat_penalty: float = InferOptions().sampler.repeat_penalty
    seed: int = 0
    lora: tuple[str, ...] = ()  # NAME=PATH[:SCALE], as given
    no_prompt_cache: bool = False
    runs: str | None = None
    cflags: tuple[str, ...] = ()
    zigflags: tuple[str, ...] = ()
    force: bool = False
    debug: bool = False
    break_on: tuple[str, ...] = ()
    require_grounded: tuple[str, ...] = ()
    require_present: tuple[str, ...] = ()
    fail_item: bool = False
    limits: Limits = field(default_factory=Limits)
    #: the options given on the line (``from_args``), by name: what ``overrides`` holds
    given: frozenset[str] = frozenset()

    @classmethod
    def from_settings(cls, settings: Any) -> "JobOptions":
        """Defaults from an object carrying the traitlets (``TensorJob``)."""
        values: dict[str, Any] = {}
        limit_values: dict[str, Any] = {}
        for opt in OPTIONS:
            if opt.trait is None or not hasattr(settings, opt.trait):
                continue
            value = getattr(settings, opt.trait)
            if opt.is_limit:
                limit_values[opt.name] = None if value == 0 and opt.name in limits_table.OPTIONAL else value
            elif opt.kind == "flags":
                values[opt.name] = tuple(shlex.split(value))
            elif opt.kind == "loras":
                values[opt.name] = tuple(value)
            elif value != "" or opt.kind not in ("text", "path"):
                values[opt.name] = value
        try:
            return cls(limits=Limits(**limit_values), **values)
        except ValueError as e:
            raise OptionError(f"TensorJob settings: {e}") from None

    @classmethod
    def from_args(cls, args: Any, *, defaults: "JobOptions | None" = None,
                  variables: Mapping[str, Any] | None = None, local_model: bool = True) -> "JobOptions":
        """The options given in a parsed namespace, over ``defaults``; checked.
        ``local_model=False``: the model need not exist here (a map on a cluster:
        its workers check it)."""
        base = defaults or cls()
        changes: dict[str, Any] = {}
        limit_changes: dict[str, Any] = {}
        for opt in OPTIONS:
            text = getattr(args, opt.name, None)
            if text is None:
                continue
            value = _read(opt, text, variables)
            (limit_changes if opt.is_limit else changes)[opt.name] = value
        given = frozenset(changes) | frozenset(limit_changes)
        options = dataclasses.replace(base, limits=base.limits.replace(**limit_changes), given=given, **changes)
        return options.checked(local_model=local_model)

    def checked(self, *, local_model: bool = True) -> "JobOptions":
        """Raise ``OptionError`` if a file an option names does not exist."""
        for path in self.read:
            if not os.path.exists(path):
                raise OptionError(f"--read {path}: no such file or directory")
        if self.input_file is not None and not os.path.isfile(self.input_file):
            raise OptionError(f"--input-file {self.input_file}: no such file")

        ref = self.model_ref()
        try:
            ref.check(local=local_model)
        except ValueError as e:
            raise OptionError(str(e) if str(e).startswith("--") else f"--model: {e}") from None
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.repeat_penalty <= 0:
            flag, value = (("--temperature", self.temperature) if self.temperature < 0 else
                           ("--top-p", self.top_p) if not 0 < self.top_p <= 1 else
                           ("--repeat-penalty", self.repeat_penalty))
            rule = {"--temperature": "at least 0", "--top-p": "over 0 and at most 1",
                    "--repeat-penalty": "over 0"}[flag]
            raise OptionError(f"{flag} {value}: must be {rule}")
        if not 0 <= self.seed < 2**32:
            raise OptionError(f"--seed {self.seed}: must be 0 to 4294967295")
        self._fetch  # --fetch parsed here, once (the adapters' files: ``ModelRef.check`` above)
        return self

    def input_bytes(self) -> bytes:
        if self.input_file is None:
            return b""
        try:
            with open_regular(self.input_file) as f:  # a FIFO or a device named here is refused, never read
                return f.read()
        except OSError as e:
            raise OptionError(f"--input-file {self.input_file}: {e.strerror}") from None

    def loras(self) -> dict[str, tuple[str, float]]:
        """``--lora`` as {name: (absolute path, scale)}, read once (and kept); ``OptionError`` names a bad one."""
        return self._loras

    @functools.cached_property
    def _loras(self) -> dict[str, tuple[str, float]]:
        out: dict[str, tuple[str, float]] = {}
        for spec in self.lora:
            name, eq, rest = spec.partition("=")
            path, scale = rest, 1.0
            head, colon, tail = rest.rpartition(":")
            if colon and head:
                try:
                    path, scale = head, float(tail)
                except ValueError:
                    path, scale = rest, 1.0
            if not eq or not name.strip() or not path:
                raise OptionError(f"--lora {spec}: expected NAME=PATH or NAME=PATH:SCALE")
            if name.strip() in out:
                raise OptionError(f"--lora {spec}: two adapters are named {name.strip()!r}")
            out[name.strip()] = (os.path.abspath(path), scale)
        return out

    @functools.cached_property
    def _fetch(self) -> FetchGrants:
        """``--fetch``'s prefixes as grants, parsed once (and kept); ``OptionError`` names a bad one."""
        try:
            return FetchGrants.parse(self.fetch)
        except ValueError as e:
            raise OptionError(f"--fetch: {e}") from None

    def infer_options(self) -> InferOptions:
        return InferOptions.of(temperature=self.temperature, top_p=self.top_p, repeat_penalty=self.repeat_penalty,
                               seed=self.seed, chat=self.chat, cache_prompt=not self.no_prompt_cache,
                               lora={name: scale for name, (_path, scale) in self.loras().items()})

    def model_ref(self) -> ModelRef:
        """The model these options name (``--model``, ``--model-name``, ``--api-key-env``, ``--lora``), read
        once (and kept); ``OptionError`` names an option that does not belong to its kind."""
        return self._model_ref

    @functools.cached_property
    def _model_ref(self) -> ModelRef:
        loras = self.loras()
        try:
            return ModelRef.parse(self.model, model_name=self.model_name, api_key_env=self.api_key_env,
                                  loras={name: path for name, (path, _scale) in loras.items()})
        except ValueError as e:
            raise OptionError(str(e) if str(e).startswith("--") else f"--model: {e}") from None

    def guest(self, path: str | os.PathLike):
        """The guest file, loaded or compiled with these options' flags."""
        return GuestSource.from_file(path, cflags=self.cflags, zigflags=self.zigflags, force=self.force)

    def spec(self, guest: GuestSource) -> JobSpec:
        """The ``JobSpec`` of a job of ``guest`` with these options (what ``Job`` takes)."""
        return JobSpec(guest=guest, input=self.input, read=tuple(os.path.abspath(p) for p in self.read),
                       fetch=self._fetch,
                       input_bytes=self.input_bytes(), limits=self.limits, infer=self.infer_options(),
                       model=self.model_ref(), runs_dir=self.runs, debug=self.debug, break_on=self.break_on,
                       require_grounded=self.require_grounded, require_present=self.require_present,
                       fail_item=self.fail_item)

    def overrides(self) -> Overrides:
        """What these options give anew over a recorded run (a replay's ``Overrides``): each option given on the
        line, and the runs folder and model the settings name (a notebook's ``TensorJob.runs_dir``,
        ``model_path``, ...) -- never a default sampling or limit, so a replay keeps the run's own."""
        given = self.given
        infer: list[tuple[str, Any]] = [(name, getattr(self, name)) for name in ("temperature", "top_p",
                                                                                  "repeat_penalty", "seed", "chat")
                                        if name in given]
        if "no_prompt_cache" in given:
            infer.append(("cache_prompt", not self.no_prompt_cache))
        loras = self.loras() if "lora" in given else None  # a notebook's setting is no replay's
        if loras is not None:
            infer.append(("lora", {name: scale for name, (_path, scale) in loras.items()}))
        return Overrides(
            input=self.input if "input" in given else Overrides().input,
            read=self.read if "read" in given else None, fetch=self._fetch if "fetch" in given else None,
            input_bytes=self.input_bytes() if self.input_file is not None else None,
            limits=tuple((name, getattr(self.limits, name)) for name in limits_table.FIELDS if name in given),
            infer=tuple(infer), **self._model_overrides(loras),
            runs_dir=self.runs, debug=self.debug if "debug" in given else None,
            break_on=self.break_on if "break_on" in given else None,
            require_grounded=self.require_grounded if "require_grounded" in given else None,
            require_present=self.require_present if "require_present" in given else None,
            fail_item=self.fail_item if "fail_item" in given else None)

    def _model_overrides(self, loras: dict | None) -> dict:
        """The model given anew: the one ``--model`` names with its options (parsed once, ``model_ref``), or with
        no ``--model`` only the options, for the recorded model."""
        if self.model is not None:
            return {"model": self.model_ref()}
        return {"model_name": self.model_name, "api_key_env": self.api_key_env,
                "loras": tuple((name, path) for name, (path, _scale) in loras.items()) if loras is not None else None}

    def map_spec(self, guest: GuestSource) -> JobSpec:
        """The ``JobSpec`` every item of a map of ``guest`` starts from (what ``start_map`` takes): these options
        but for the input, which each item takes from the manifest."""
        return self.spec(guest).replace(input=None, debug=False, break_on=())


def _unquote(text: str) -> str:
    """One layer of matching quotes off: the magics' argument splitter keeps them."""
    text = text.strip()
    return text[1:-1] if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"" else text


def _read(opt: Option, text: Any, variables: Mapping[str, Any] | None) -> Any:
    """One option's text -> its value; ``OptionError`` names the flag."""
    if isinstance(text, list):
        text = [_unquote(t) for t in text]
    elif isinstance(text, str) and opt.kind != "json":  # the input is read as written: input_value decides
        text = _unquote(text)
    try:
        if opt.is_limit:
            try:
                value = _parse_limit(opt.kind, text)
            except OptionError as e:
                raise OptionError(f"{opt.flag}: {e}") from None
            limits_table.check(opt.name, value)
            return value
        if opt.kind in ("paths", "loras"):
            return tuple(text)
        if opt.kind == "names":
            return parse_break_on(text if isinstance(text, list) else [text])
        if opt.kind == "fields":
            return parse_fields(text if isinstance(text, list) else [text])
        if opt.kind in ("switch", "onoff"):
            return bool(text)
        if opt.kind == "float":
            return float(text)
        if opt.kind == "int":
            return int(text)
        if opt.kind == "flags":
            return tuple(shlex.split(text))
        if opt.kind == "json":
            return _read_input(text, variables)
        return text
    except OptionError:
        raise
    except ValueError as e:
        raise OptionError(f"{opt.flag} {e}" if opt.is_limit else f"{opt.flag}: {e}") from None


def _read_input(text: str, variables: Mapping[str, Any] | None) -> Any:
    """``--input``: JSON, ``$name`` or (in a notebook) a Python literal (``input_value``)."""
    try:
        return read_input(text, variables)
    except InputError as e:
        raise OptionError(str(e)) from None


# --- the experiment options: a gate and a width -------------------------------------------------


def concurrency_value(text: str) -> int | str:
    """``--concurrency``: ``auto`` or a whole number at least 1; anything else is one usage line."""
    text = text.strip()
    if text == AUTO:
        return AUTO
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is neither auto nor a whole number at least 1")
    return value


def fail_under(text: str | None) -> float | str | None:
    """``--fail-under``: a score from 0 to 1, or ``recorded`` (the recorded map's mean); None when not given."""
    if text is None or text.strip().lower() == "recorded":
        return None if text is None else "recorded"
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise OptionError(f"--fail-under {text}: a score from 0 to 1, or 'recorded' (the recorded map's mean)")
    return value


__all__ = [
    "OptionError", "parse_bytes", "Option", "OPTIONS", "BY_NAME", "add_job_arguments", "job_arguments", "traitlets",
    "JobOptions", "concurrency_value", "fail_under"
]
