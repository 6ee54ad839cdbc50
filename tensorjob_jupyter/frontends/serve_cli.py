"""``tensorjob serve``: the subcommand's parser and its run -- a thin shell over ``tensorjob_jupyter.serve``.

Every flag is checked before the model loads, and the model loads before the socket opens: a bad flag is one
usage line (exit 2), a model that cannot load is one error line (exit 1), and "serving at" means serving.
"""

from __future__ import annotations

import os
from typing import TextIO

from tensorjob_jupyter import serve
from tensorjob_jupyter.abi import JobFailure
from tensorjob_jupyter.frontends.options import EXIT_FAILED, EXIT_OK, OptionError
from tensorjob_jupyter.host import ModelRef
from tensorjob_jupyter.serve import BODY_TIMEOUT_S, HEADER_TIMEOUT_S


def add_serve_parser(sub) -> None:
    serve = sub.add_parser("serve", help="serve the model to other kernels (an OpenAI-compatible API)",
                           description="Serve a model over an OpenAI-compatible HTTP API; jobs elsewhere use it "
                                       "with --model http://HOST:PORT/v1 and share one copy, batched.")
    serve.add_argument("--model", default=None, metavar="PATH",
                       help="a GGUF file or hf:ORG/REPO[:QUANT] (default: the embedded SmolLM2)")
    serve.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="the port (default: 8000; 0 picks a free one)")
    serve.add_argument("--slots", type=int, default=4, help="sequences decoded together (default: 4)")
    serve.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: the physical cores)")
    serve.add_argument("--n-ctx", type=int, default=2048, help="the context of each slot (default: 2048)")
    serve.add_argument("--api-key-env", default=None, metavar="VAR",
                       help="require Authorization: Bearer $VAR on every request")
    serve.add_argument("--header-timeout", type=float, default=HEADER_TIMEOUT_S, metavar="S",
                       help=f"seconds a client may take to send a request's headers (default: {HEADER_TIMEOUT_S:g})")
    serve.add_argument("--body-timeout", type=float, default=BODY_TIMEOUT_S, metavar="S",
                       help=f"seconds a client may take to send a request's body (default: {BODY_TIMEOUT_S:g})")
    serve.add_argument("--quiet", "-q", action="store_true",
                       help="no line per request on stdout (method, path, status, tokens, ms)")


def cmd_serve(args, out: TextIO, err: TextIO) -> int:
    try:
        import starlette  # noqa: F401  (deferred: the serve extra's, checked before the model loads)
        import uvicorn  # noqa: F401
    except ImportError as e:
        err.write(f"tensorjob: error: tensorjob serve needs the serve extra ({e.name} is missing): "
                  "pip install 'tensorjob-jupyter[serve]'\n")
        return EXIT_FAILED
    for name, low, high in (("slots", 1, 256), ("n_ctx", 16, 1 << 20), ("port", 0, 65535), ("threads", 1, 1024),
                            ("header_timeout", 0.1, 3600), ("body_timeout", 0.1, 3600)):
        value = getattr(args, name)
        if value is not None and not low <= value <= high:  # a NaN is never in range
            raise OptionError(f"--{name.replace('_', '-')} {value}: out of range ({low} to {high})")
    api_key = None
    if args.api_key_env is not None:
        api_key = os.environ.get(args.api_key_env)
        if not api_key:
            raise OptionError(f"--api-key-env {args.api_key_env}: the variable is not set")
        if not api_key.isascii() or not api_key.isprintable():
            raise OptionError(f"--api-key-env {args.api_key_env}: a key is printable ASCII (an HTTP header carries it)")
    try:
        backend = serve.load_model(ModelRef.parse(args.model), slots=args.slots, n_ctx=args.n_ctx,
                                   threads=args.threads)
    except JobFailure as e:  # ModelError: the model cannot load
        err.write(f"tensorjob: error: {e}\n")
        return EXIT_FAILED
    except ValueError as e:
        raise OptionError(f"--model: {e}") from None
    try:
        sock = serve.bind(args.host, args.port)
    except OSError as e:
        raise OptionError(f"--host {args.host} --port {args.port}: {e.strerror}") from None
    serve.listen(backend, sock, api_key=api_key, quiet=args.quiet, header_timeout_s=args.header_timeout,
                 body_timeout_s=args.body_timeout, out=out, err=err)
    return EXIT_OK


__all__ = ["add_serve_parser", "cmd_serve"]
