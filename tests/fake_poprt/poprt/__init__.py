"""A fake of Graphcore's ``poprt`` (PopRT 1.5 API) for tests; put ``tests/fake_poprt`` on PYTHONPATH.

Modules and names follow ``/work/shared/reference/poprt-facts.md``: ``compiler`` (``Compiler``,
``CompilerOptions``), ``converter`` (``Sharder``, ``Converter``), ``Pass``, ``runtime`` (``DeviceManager``, ``Runner``,
``RuntimeConfig``) and ``profile`` (``Profiler``). Compiles check PopART's rules with PopART's
texts, then apply a memory truth of their own; failures are ``RuntimeError``.

Environment knobs, read at every compile:

- ``FAKE_POPRT_TILES``: tiles per IPU (default 1472). The OOM text names global tile
  ``ipu * tiles + local``.
- ``FAKE_POPRT_TILE_BYTES``: bytes per tile (default 638976).
- ``FAKE_POPRT_TRUTH``: JSON overriding fields of ``compiler.Truth`` (``imbalance``,
  ``tile_overhead``, ``weight_factor``, ``activation_factor``, ``temp_factor``,
  ``scratch_factor``, ``exchange_factor``, ``stream_factor``, ``code_default``, ``code_bytes``
  merged by op type, and the non-uniform families ``op_tiles``, ``exchange_by_op``, ``noise``),
  e.g. ``{"weight_factor": 40}`` to make the truth harsher.
- ``FAKE_POPRT_MODE``: ``normal`` (default); ``variables``, ``code``, ``exchange``, ``stream``:
  every valid compile fails with that out-of-memory text on the fullest IPU; ``segfault``:
  the process kills itself with SIGSEGV; ``hang``: it blocks until a signal ends it;
  ``unknown_error``: a ``RuntimeError`` no parser knows. Validation errors come first.
- ``FAKE_POPRT_COMPILE_SECONDS``: simulated compile time (default 0).
- ``FAKE_POPRT_CONVERT_OPS``: JSON, node name → the op type ``Converter.convert`` gives it (a
  pass that rewrites a MatMul as a Gemm: MatMul-only attributes put back by name are not set).
- ``FAKE_POPRT_LOG``: append one JSON line per compile call (options, the
  ``POPLAR_ENGINE_OPTIONS`` it saw, the distinct per-op ``__available_memory`` values
  (``op_amps``), per-IPU worst-tile bytes, result and error text).

A conv/matmul/Gemm node's FLOAT ``__available_memory`` attribute replaces the session's
``available_memory_proportion`` for that op's temporaries, as PopART reads it; out of (0, 1] it
is refused with the session option's text. A MatMul's ``__serialize_matmul_mode`` (not ``none``)
with ``__serialize_matmul_factor`` k divides its temporaries by k (the fake's model); the log's
``serialized_matmuls`` maps each such node to k.

As in Poplar, ``POPLAR_ENGINE_OPTIONS`` with ``debug.allowOutOfMemory`` (or ``autoReport.all``)
turns a real out-of-memory into the numberless "Cannot fit all variable data" text.
The runtime's hardware is ``ipu2``.
"""

from __future__ import annotations

from poprt import compiler, converter, profile, runtime
from poprt.passes import Pass

__all__ = ["Pass", "compiler", "converter", "profile", "runtime"]
__version__ = "1.5.0"
