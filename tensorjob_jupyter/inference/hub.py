"""Models by name: ``hf:ORG/REPO[:FILE_OR_QUANT]`` resolved to a GGUF file in the Hugging Face cache.

``hf:ORG/REPO`` names the repository's one GGUF file (or the first of ``DEFAULT_QUANTS``),
``hf:ORG/REPO:FILE.gguf`` a file and ``hf:ORG/REPO:QUANT`` a quantisation. The standard cache is
looked in first, without the network; only a model not cached is downloaded, with
``huggingface_hub``. The hub is reached once within ``REACH_TIMEOUT_S`` first, so a model that is
not cached on an offline machine is one line within seconds, not half a minute of retries.

Design: docs/internals/inference.md#hubpy
"""

from __future__ import annotations

import os
import re
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from tensorjob_jupyter.inference.base import ModelError

PREFIX = "hf:"
#: Tried in order when a repository holds several GGUF files and the reference names none.
DEFAULT_QUANTS = ("Q4_K_M", "Q4_K_S", "Q4_0", "Q4_1", "Q5_K_M", "Q8_0")
_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
#: How long the hub (or the proxy) may take to accept a connection before the machine counts as offline.
REACH_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class HfRef:
    repo: str
    selector: str | None = None  # a file in the repository, or a quantisation

    def __str__(self) -> str:
        return f"{PREFIX}{self.repo}" + (f":{self.selector}" if self.selector else "")


def is_hf_ref(model) -> bool:
    return isinstance(model, str) and model.startswith(PREFIX)


def parse_ref(text: str) -> HfRef:
    """``hf:ORG/REPO[:FILE_OR_QUANT]`` -> ``HfRef``; ``ValueError`` says what is wrong."""
    if not is_hf_ref(text):
        raise ValueError(f"{text!r} is not a Hugging Face reference (hf:ORG/REPO[:FILE_OR_QUANT])")
    body = text[len(PREFIX):]
    repo, _, selector = body.partition(":")
    if not _REPO.match(repo) or ".." in repo:
        raise ValueError(f"{text!r}: the repository must be ORG/REPO (letters, digits, _ . -), as in "
                         f"hf:HuggingFaceTB/SmolLM2-135M-Instruct-GGUF")
    if selector and (selector.startswith("/") or ".." in selector.split("/") or "\\" in selector):
        raise ValueError(f"{text!r}: {selector!r} is not a file inside the repository")
    return HfRef(repo, selector or None)


def cache_dir() -> Path:
    """The Hugging Face hub cache, read from the environment now (as huggingface_hub reads it)."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(name):
            return Path(os.environ[name]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _cached_snapshot(ref: HfRef) -> Path | None:
    """The snapshot folder of the repository's main revision in the cache, if there is one."""
    folder = cache_dir() / ("models--" + ref.repo.replace("/", "--"))
    main = folder / "refs" / "main"
    snapshots = folder / "snapshots"
    if main.is_file():
        commit = main.read_text().strip()
        if commit and (snapshots / commit).is_dir():
            return snapshots / commit
    if snapshots.is_dir():
        found = sorted(p for p in snapshots.iterdir() if p.is_dir())
        if len(found) == 1:
            return found[0]
    return None


def _gguf_files(names) -> list[str]:
    return sorted(n for n in names if n.lower().endswith(".gguf") and "mmproj" not in n.lower().rsplit("/", 1)[-1])


def choose(ref: HfRef, files: list[str]) -> list[str]:
    """The repository files ``ref`` names among ``files`` (the parts of a split model, in order);
    ``ModelError`` when it names none, or several models."""
    ggufs = _gguf_files(files)
    if not ggufs:
        raise ModelError(f"{ref} holds no GGUF file")
    if ref.selector and ref.selector.lower().endswith(".gguf"):
        exact = [f for f in ggufs if f == ref.selector] or [f for f in ggufs if f.rsplit("/", 1)[-1] == ref.selector]
        if len(exact) != 1:
            raise ModelError(f"{ref}: no file {ref.selector!r} in the repository (GGUF files: {_listing(ggufs)})")
        return _with_parts(exact[0], ggufs)
    quants = [ref.selector] if ref.selector else list(DEFAULT_QUANTS)
    for quant in quants:
        pattern = re.compile(rf"(?<![A-Za-z0-9]){re.escape(quant)}(?![A-Za-z0-9])", re.IGNORECASE)
        matches = [f for f in ggufs if pattern.search(f.rsplit("/", 1)[-1])]
        models = sorted({_SPLIT.sub(".gguf", f) for f in matches})
        if len(models) == 1:
            first = sorted(matches)[0]
            return _with_parts(first, ggufs)
        if len(models) > 1:
            raise ModelError(f"{ref}: {quant} matches several files ({_listing(models)}); name the file")
    if not ref.selector and len(ggufs) == 1:
        return ggufs
    if not ref.selector and len({_SPLIT.sub(".gguf", f) for f in ggufs}) == 1:
        return _with_parts(ggufs[0], ggufs)
    what = f"no file with {ref.selector!r} in its name" if ref.selector else "several GGUF files"
    raise ModelError(f"{ref}: {what} ({_listing(ggufs)}); add :FILE or :QUANT, e.g. {ref}:Q4_K_M")


def _with_parts(first: str, files: list[str]) -> list[str]:
    m = _SPLIT.search(first)
    if not m:
        return [first]
    stem = first[:m.start()]
    count = int(m.group(2))
    parts = [f"{stem}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]
    lowered = {f.lower(): f for f in files}
    missing = [p for p in parts if p.lower() not in lowered]
    if missing:
        raise ModelError(f"the split model {first} lacks parts: {', '.join(missing[:3])}")
    return [lowered[p.lower()] for p in parts]


def _listing(files: list[str], limit: int = 8) -> str:
    return ", ".join(files[:limit]) + (f", ... ({len(files) - limit} more)" if len(files) > limit else "")


def cached(model: str) -> Path | None:
    """The local GGUF file ``model`` (``hf:...``) names if the cache holds it whole; None otherwise. Never the
    network."""
    try:
        ref = parse_ref(model)
    except ValueError:
        return None
    return _from_cache(ref)


def resolve(model: str, *, progress: bool = True) -> Path:
    """The local GGUF file ``model`` (``hf:...``) names: from the cache, else downloaded into it."""
    try:
        ref = parse_ref(model)
    except ValueError as e:
        raise ModelError(str(e)) from None
    found = _from_cache(ref)
    if found is not None:
        return found
    if offline():
        raise ModelError(f"{ref} is not in the Hugging Face cache ({cache_dir()}) and HF_HUB_OFFLINE is set, "
                         f"so it cannot be downloaded")
    unreachable = _unreachable()
    if unreachable is not None:
        raise ModelError(f"{ref} is not in the Hugging Face cache ({cache_dir()}), and {unreachable}: this machine "
                         f"looks offline; download it where there is network, or give --model a local .gguf file")
    return _download(ref, progress)


def _from_cache(ref: HfRef) -> Path | None:
    snapshot = _cached_snapshot(ref)
    if snapshot is not None:
        cached = [p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*.gguf")]
        try:
            parts = choose(ref, cached)
        except ModelError:
            parts = []
        if parts and all((snapshot / p).is_file() for p in parts):
            return (snapshot / parts[0]).absolute()  # the snapshot's name, not its blob's (a symlink)
    return None


def _endpoint() -> tuple[str, str, int]:
    """What a download would connect to first: (what it is, host, port) -- a proxy the environment names, else
    the hub itself."""
    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        if os.environ.get(name):
            url = urlsplit(os.environ[name] if "://" in os.environ[name] else "http://" + os.environ[name])
            return f"the proxy {url.hostname}", url.hostname or "", url.port or 80
    url = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    return url.hostname or "", url.hostname or "", url.port or (443 if url.scheme == "https" else 80)


def _unreachable(timeout: float = REACH_TIMEOUT_S) -> str | None:
    """None when the hub accepts a connection within ``timeout``; else why it cannot be reached, in words.

    The name lookup has no timeout of its own, so the attempt runs on a helper thread that is left behind (a
    daemon: it ends with the lookup) if it takes longer."""
    what, host, port = _endpoint()
    outcome: list[str | None] = []

    def attempt() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            outcome.append(None)
        except OSError as e:
            outcome.append(f"{what} cannot be reached ({e.strerror or type(e).__name__})")

    helper = threading.Thread(target=attempt, name="tensorjob-hub-reach", daemon=True)
    helper.start()
    helper.join(timeout + 0.5)
    return outcome[0] if outcome else f"{what} cannot be reached (no answer within {timeout:.0f} s)"


def _download(ref: HfRef, progress: bool) -> Path:  # pragma: no cover - needs the network; never run in tests
    try:
        import huggingface_hub
        from huggingface_hub.utils import disable_progress_bars, enable_progress_bars
    except ImportError as e:
        raise ModelError(f"{ref} needs the huggingface_hub package to download ({e})") from None
    try:
        files = huggingface_hub.list_repo_files(ref.repo)
        parts = choose(ref, files)
        if not progress:
            disable_progress_bars()
        try:
            paths = [huggingface_hub.hf_hub_download(ref.repo, p, cache_dir=str(cache_dir())) for p in parts]
        finally:
            if not progress:
                enable_progress_bars()
    except ModelError:
        raise
    except Exception as e:  # noqa: BLE001 - network, authorisation, a missing repository
        raise ModelError(f"could not fetch {ref} from Hugging Face: {type(e).__name__}: "
                         f"{' '.join(str(e).split())[:300]}") from None
    return Path(paths[0]).absolute()


__all__ = ["cached", 
    "PREFIX", "DEFAULT_QUANTS", "REACH_TIMEOUT_S", "HfRef", "is_hf_ref", "parse_ref", "cache_dir", "offline",
    "choose", "resolve"
]
