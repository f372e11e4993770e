"""``sharderd``: the command line. Thin: parse, call the engine or the daemon, print, exit.

Exit codes (other tools rely on them): 0 done, 1 failed (compile or verification), 2 bad input or
usage, 3 does not fit, 4 backend unavailable.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from sharderd import __version__
from sharderd.config import Config, load_config
from sharderd.errors import EXIT_OK, ConfigError, SharderdError

__all__ = ["main"]


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", type=Path, help="the .onnx file (external data beside it)")
    p.add_argument("--devices", "-n", type=int, required=True, help="pipeline stages, one device each")
    p.add_argument("--target", "-t", help="device description (default: config [target] name, ipu-mk2)")
    p.add_argument("--config", "-c", type=Path, help="sharderd.toml")
    p.add_argument("--batch-size", type=int, help="override plan.batch_size")
    p.add_argument("--safety-margin", type=float, help="override plan.safety_margin")
    p.add_argument("--name-nodes", action="store_true", help="name unnamed/duplicate nodes <OpType>_<k>")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sharderd", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"sharderd {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("plan", help="print the plan; write nothing")
    _add_common(p)
    p.add_argument("--json", action="store_true", help="print report.json's content")

    p = sub.add_parser("shard", help="plan, annotate, prove (backend) and write the sharded model")
    _add_common(p)
    p.add_argument("--out", "-o", type=Path, help="output folder (default ./<stem>.sharded/)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--quiet", "-q", action="store_true", help="print nothing on success")
    p.add_argument("--backend", "-b", choices=["auto", "poprt", "onnxruntime", "none"], help="prove the plan with this backend (default: search.backend, auto)")
    p.add_argument("--optimal-perf", action="store_true", help="after the first success, compile and benchmark plans that may be faster")
    p.add_argument("--max-attempts", type=int, help="compile attempts at most (default: search.max_attempts)")
    p.add_argument("--parallel", type=int, help="attempts at once (default: search.parallel)")
    p.add_argument("--attempt-timeout", type=float, help="seconds per attempt (default: search.attempt_timeout)")

    p = sub.add_parser("example-model", help="write a model generated locally (no download)")
    p.add_argument("kind", nargs="?", default="transformer", help="transformer, cnn, shared_weights, with_if, multi_io, chain")
    p.add_argument("--out", "-o", type=Path, help="output .onnx (default ./example-<kind>.onnx)")
    p.add_argument("--external-data", action="store_true", help="store weights in <stem>.data beside it")
    p.add_argument("--set", action="append", default=[], metavar="KEY=INT", help="builder option, e.g. layers=12")

    p = sub.add_parser("check-config", help="validate a config file and print the effective config")
    p.add_argument("file", nargs="?", type=Path, default=Path("sharderd.toml"))

    p = sub.add_parser("run", help="run the inbox daemon (JSON logs on stdout; the systemd service)")
    p.add_argument("--config", "-c", type=Path, help="sharderd.toml (default: built-in defaults)")
    return parser


def _config(args: argparse.Namespace) -> Config:
    config = load_config(args.config) if getattr(args, "config", None) else Config()
    plan = config.plan
    if getattr(args, "batch_size", None) is not None:
        plan = replace(plan, batch_size=args.batch_size)
    if getattr(args, "safety_margin", None) is not None:
        plan = replace(plan, safety_margin=args.safety_margin)
    if getattr(args, "name_nodes", False):
        plan = replace(plan, name_nodes=True)
    return replace(config, plan=plan)


def _cmd_plan(args: argparse.Namespace) -> int:
    from sharderd.engine import analyze_file, make_plan
    from sharderd.report.build import model_facts, plan_section, report_dict
    from sharderd.report.markdown import render_markdown

    config = _config(args)
    target = config.target(args.target)
    started = time.perf_counter()
    analysis = analyze_file(args.model, config.plan)
    analyzed = time.perf_counter()
    plan = make_plan(analysis, target, args.devices, config.plan)
    report = report_dict(
        timings_s={"load_and_analyze": analyzed - started, "plan": time.perf_counter() - analyzed},
        model=model_facts(analysis),
        warnings=analysis.warnings,
        target=target,
        plan=plan_section(plan, config.plan.batch_size),
        batch_size=config.plan.batch_size,
        status="planned",
    )
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(render_markdown(report), end="")
    return EXIT_OK


def _cmd_shard(args: argparse.Namespace) -> int:
    import tempfile

    import anyio

    from sharderd.backends.pool import AttemptPool
    from sharderd.pipeline.job import JobFailed, JobSpec, shard_job, write_report
    from sharderd.progress import progress
    from sharderd.report.markdown import render_markdown

    config = _config(args)
    if args.parallel is not None and args.parallel < 1:
        raise ConfigError(f"--parallel must be >= 1, got {args.parallel}")
    if args.max_attempts is not None and args.max_attempts < 1:
        raise ConfigError(f"--max-attempts must be >= 1, got {args.max_attempts}")
    stem = args.model.name.removesuffix(".onnx")
    out_dir = args.out or Path(f"{stem}.sharded")
    spec = JobSpec(
        model=args.model,
        out_dir=out_dir,
        stem=stem,
        devices=args.devices,
        config=config,
        target=args.target,
        backend=args.backend or config.search.backend,
        optimal_perf=args.optimal_perf or config.search.optimal_perf,
        max_attempts=args.max_attempts,
        parallel=args.parallel,
        attempt_timeout=args.attempt_timeout,
    )
    pool = AttemptPool(args.parallel or config.search.parallel)
    with (
        tempfile.TemporaryDirectory(prefix="sharderd-attempts-") as work,
        progress(quiet=args.quiet, json_mode=args.json) as emit,
    ):

        async def run() -> Any:
            return await shard_job(spec, pool=pool, workdir=Path(work), emit=emit)

        try:
            result = anyio.run(run)
        except JobFailed as failed:
            if failed.report is not None and failed.report.get("attempts"):
                write_report(failed.report, out_dir)
                print(f"sharderd: report of the failed attempts: {out_dir}/report.md", file=sys.stderr)
            raise failed.error from None
    if args.json:
        print(json.dumps(result.report, indent=1))
    elif not args.quiet:
        print(render_markdown(result.report), end="")
        print(f"wrote {out_dir}/")
    return EXIT_OK


def _cmd_example(args: argparse.Namespace) -> int:
    from sharderd import examples

    if args.kind not in examples.EXAMPLES:
        raise ConfigError(f"unknown example {args.kind!r}; choose from {', '.join(examples.EXAMPLES)}")
    options: dict[str, Any] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not value.lstrip("-").isdigit():
            raise ConfigError(f"--set expects KEY=INT, got {item!r}")
        options[key] = int(value)
    try:
        model = examples.EXAMPLES[args.kind](**options)
    except TypeError as exc:
        raise ConfigError(f"example {args.kind!r}: {exc}") from None
    out = args.out or Path(f"example-{args.kind}.onnx")
    examples.save(model, out, external_data=args.external_data)
    print(out)
    return EXIT_OK


def _cmd_check_config(args: argparse.Namespace) -> int:
    from sharderd.config import describe_config

    print(describe_config(load_config(args.file)), end="")
    return EXIT_OK


def _cmd_run(args: argparse.Namespace) -> int:
    """The daemon; SIGTERM or SIGINT stop it cleanly (exit 0), also during start-up."""
    import signal

    import anyio

    from sharderd.daemon.service import serve
    from sharderd.logs import configure_logging

    # Until serve() installs its own handlers, a stop request interrupts start-up before anything
    # was claimed: turn SIGTERM into the same KeyboardInterrupt as SIGINT and exit cleanly.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    configure_logging()
    config = load_config(args.config) if args.config else Config()
    try:
        anyio.run(serve, config)
    except KeyboardInterrupt:
        print("sharderd: stopped during start-up", file=sys.stderr)
    return EXIT_OK


_COMMANDS = {
    "plan": _cmd_plan,
    "shard": _cmd_shard,
    "example-model": _cmd_example,
    "check-config": _cmd_check_config,
    "run": _cmd_run,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _COMMANDS[args.command](args)
    except SharderdError as err:
        print(f"sharderd: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("sharderd: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
