"""The attempt subprocess: ``python -m sharderd.backends.worker REQUEST.json RESULT.json``.

Reads an ``AttemptRequest``, imports only the backend it names from the registry
(``sharderd.backends.registry``: the shipped backends plus any in ``SHARDERD_EXTRA_BACKENDS``, which
tests use for their ``fault`` backend; the SDK is imported here, never by the parent), runs it and
writes the ``AttemptOutcome`` atomically. A backend failure it does not catch propagates: the
non-zero exit and stderr tail are the parent's evidence for ``crashed``.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from sharderd.backends.protocol import AttemptOutcome, AttemptRequest
from sharderd.backends.registry import load_backend, registered

__all__ = ["main"]

EXIT_USAGE = 2


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m sharderd.backends.worker REQUEST.json RESULT.json", file=sys.stderr)
        return EXIT_USAGE
    started = time.monotonic()
    request = AttemptRequest.read(Path(args[0]))
    backends = registered()
    if request.backend not in backends:
        known = ", ".join(sorted(backends))
        print(f"unknown backend {request.backend!r} (known: {known})", file=sys.stderr)
        return EXIT_USAGE
    outcome: AttemptOutcome = load_backend(request.backend).run_attempt(request)
    outcome = dataclasses.replace(outcome, duration_s=time.monotonic() - started)
    outcome.write(Path(args[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
