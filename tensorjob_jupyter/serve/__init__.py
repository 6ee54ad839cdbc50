"""serve: the model for other kernels, over an OpenAI-compatible HTTP API (``tensorjob serve``).

Owns: ``openai_wire`` (a request read into one checked generation, as a guest's infer is; its answer written
back), ``server`` (the HTTP app: answers streamed, every bound) and ``model`` (the served model, loaded before the socket opens). It runs no job: it answers requests with the
model worker itself.
May import: ``inference``, the host's output constraints (``host.structured``, ``host.schemas``) and the wire
modules (``abi``, ``limits``, ``text``). Never ``sandbox``, ``world``, ``record``, ``host.jobs``, ``fanout``,
``history`` or ``frontends`` (``pyproject.toml``'s contracts say so, and CI checks them).
"""

from tensorjob_jupyter.serve.model import load_model
from tensorjob_jupyter.serve.server import BODY_TIMEOUT_S, HEADER_TIMEOUT_S, bind, build_app, listen

__all__ = ["BODY_TIMEOUT_S", "HEADER_TIMEOUT_S", "bind", "build_app", "listen", "load_model"]
