"""``sharderd``'s parser and commands. Thin: parse, call the engine or the daemon, print, exit.

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
from sharderd.errors import EXIT_FAILED, EXIT_OK, ConfigError, SharderdError

__all__ = ["main"]

_DESCRIPTION = (
    "Split an ONNX model into pipeline stages, one accelerator each (IPU via PopRT, or checked "
    "with onnxruntime), or run the inbox daemon that does it for every model dropped in."
)


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", type=Path, help="the .onnx file (external data beside it)")
    p.add_argument(
        "--devices", "-n", type=int, required=True, help="pipeline stages, one device each"
    )
    p.add_argument(
        "--target", "-t", help="device description (default: config [target] name, ipu-mk2)"
    )
    p.add_argument("--config", "-c", type=Path, help="sharderd.toml")
    p.add_argument("--batch-size", type=int, help="override plan.batch_size")
    p.add_argument("--safety-margin", type=float, help="override plan.safety_margin")
    p.add_argument(
        "--name-nodes", action="store_true", help="name unnamed/duplicate nodes <OpType>_<k>"
    )
    p.add_argument(
        "--input-shape",
        action="append",
        default=[],
        metavar="NAME=D0,D1,...",
        help="static shape of a graph input, as PopRT's --input_shape (repeatable; adds to plan.input_shapes)",
    )
    p.add_argument(
        "--dim",
        action="append",
        default=[],
        metavar="NAME=N",
        help="value of a named symbolic dim, e.g. sequence=128 (repeatable; adds to plan.dims)",
    )
    p.add_argument(
        "--precision",
        choices=["fp32", "fp16"],
        help="plan and write at this precision (default: plan.precision, the model's own)",
    )
    p.add_argument(
        "--keep-dynamic",
        action="store_true",
        help="write the sharded model with the input dims as the file has them, not the planned static shapes",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sharderd",
        description=_DESCRIPTION,
        epilog="Exit codes: 0 done, 1 compile or verification failed, 2 bad input or usage, 3 does not fit, "
        "4 backend unavailable. `sharderd COMMAND --help` shows a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"sharderd {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "plan",
        help="print the plan; write nothing",
        epilog="plan never compiles or runs the model; to prove a plan (--backend, --optimal-perf, "
        "--out, ...) use `sharderd shard`.",
    )
    _add_common(p)
    p.add_argument("--json", action="store_true", help="print report.json's content")

    p = sub.add_parser("shard", help="plan, annotate, prove (backend) and write the sharded model")
    _add_common(p)
    p.add_argument("--out", "-o", type=Path, help="output folder (default ./<stem>.sharded/)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--quiet", "-q", action="store_true", help="print nothing on success")
    p.add_argument(
        "--backend",
        "-b",
        choices=["auto", "poprt", "onnxruntime", "none"],
        help="prove the plan with this backend (default: search.backend, auto)",
    )
    p.add_argument(
        "--optimal-perf",
        action="store_true",
        help="after the first success, compile and benchmark plans that may be faster",
    )
    p.add_argument(
        "--max-attempts", type=int, help="compile attempts at most (default: search.max_attempts)"
    )
    p.add_argument("--parallel", type=int, help="attempts at once (default: search.parallel)")
    p.add_argument(
        "--attempt-timeout",
        type=float,
        help="seconds per attempt (default: search.attempt_timeout)",
    )

    p = sub.add_parser("example-model", help="write a model generated locally (no download)")
    p.add_argument(
        "kind",
        nargs="?",
        default="transformer",
        help="transformer, cnn, shared_weights, with_if, multi_io, chain",
    )
    p.add_argument("--out", "-o", type=Path, help="output .onnx (default ./example-<kind>.onnx)")
    p.add_argument(
        "--external-data", action="store_true", help="store weights in <stem>.data beside it"
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=INT",
        help="builder option, e.g. layers=12",
    )

    p = sub.add_parser("check-config", help="validate a config file and print the effective config")
    p.add_argument("file", nargs="?", type=Path, default=Path("sharderd.toml"))

    p = sub.add_parser(
        "run", help="run the inbox daemon (JSON logs on stdout; the systemd service)"
    )
    p.add_argument("--config", "-c", type=Path, help="sharderd.toml (default: built-in defaults)")

    ops_config = "the daemon's sharderd.toml (default: /etc/sharderd/sharderd.toml if it exists, else built-in defaults)"
    p = sub.add_parser(
        "status", help="is the daemon up, and its queue and pool (exit 1 when it is not up)"
    )
    p.add_argument("--config", "-c", type=Path, help=ops_config)
    p.add_argument("--json", action="store_true", help="print the verdict and status.json as JSON")

    p = sub.add_parser(
        "retry", help="move a failed job's input from state_dir/failed/ back into the inbox"
    )
    p.add_argument("name", help="the job's folder in state_dir/failed/")
    p.add_argument("--config", "-c", type=Path, help=ops_config)

    p = sub.add_parser(
        "cancel", help="ask the daemon to cancel a pending or running job (it goes to failed/)"
    )
    p.add_argument("job_id", help="as in the log's job_id and `sharderd status`")
    p.add_argument("--config", "-c", type=Path, help=ops_config)
    for command in sub.choices.values():
        command.set_defaults(command_parser=command)
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
    if getattr(args, "dim", None):
        plan = replace(plan, dims={**plan.dims, **dict(_parse_dim(text) for text in args.dim)})
    if getattr(args, "input_shape", None):
        shapes = dict(_parse_input_shape(text) for text in args.input_shape)
        plan = replace(plan, input_shapes={**plan.input_shapes, **shapes})
    if getattr(args, "precision", None):
        plan = replace(plan, precision=args.precision)
    if getattr(args, "keep_dynamic", False):
        plan = replace(plan, keep_dynamic=True)
    return replace(config, plan=plan)


def _parse_dim(text: str) -> tuple[str, int]:
    name, sep, value = text.rpartition("=")
    if not sep or not name:
        raise ConfigError(f"--dim {text!r}: expected NAME=N, e.g. --dim sequence=128")
    try:
        size = int(value)
    except ValueError:
        raise ConfigError(f"--dim {text!r}: {value!r} is not an integer") from None
    if size < 1:
        raise ConfigError(f"--dim {text!r}: dims must be >= 1")
    return name, size


def _parse_input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    name, sep, value = text.rpartition("=")
    if not sep or not name:
        raise ConfigError(
            f"--input-shape {text!r}: expected NAME=D0,D1,..., e.g. --input-shape input_ids=1,128"
        )
    try:
        shape = tuple(int(d) for d in value.split(",")) if value.strip() else ()
    except ValueError:
        raise ConfigError(
            f"--input-shape {text!r}: dims must be integers separated by commas"
        ) from None
    if any(d < 1 for d in shape):
        raise ConfigError(f"--input-shape {text!r}: dims must be >= 1")
    return name, shape


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
    from sharderd.cli.progress import progress
    from sharderd.job.run import JobFailed, JobSpec, shard_job, write_report
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
                print(
                    f"sharderd: report of the failed attempts: {out_dir}/report.md", file=sys.stderr
                )
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
        raise ConfigError(
            f"unknown example {args.kind!r}; choose from {', '.join(examples.EXAMPLES)}"
        )
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


def _ops_config(args: argparse.Namespace) -> Config:
    from sharderd.cli.status import OPS_CONFIG

    path = args.config or (OPS_CONFIG if OPS_CONFIG.is_file() else None)
    return load_config(path)


def _cmd_status(args: argparse.Namespace) -> int:
    from sharderd.cli.status import read_status, render_text, status_json

    status = read_status(_ops_config(args))
    if args.json:
        print(json.dumps(status_json(status), indent=1))
    else:
        print(render_text(status), end="")
    return EXIT_OK if status.up else EXIT_FAILED


def _cmd_retry(args: argparse.Namespace) -> int:
    from sharderd.daemon.control import retry_failed

    daemon = _ops_config(args).daemon
    result = retry_failed(
        daemon.state_dir.absolute() / "failed", daemon.inbox.absolute(), args.name
    )
    moved = " and ".join(str(p) for p in result.moved)
    print(f"retrying {result.name}: moved {moved}")
    if result.old_job_id:
        print(
            f"the failed run was job {result.old_job_id} ({result.reason}); its journal record keeps the error"
        )
    if result.left is not None:
        print(f"kept {result.left}: it holds files other than the job's error and reports")
    return EXIT_OK


def _cmd_cancel(args: argparse.Namespace) -> int:
    from sharderd.cli.status import read_status
    from sharderd.daemon.control import JobNotFoundError, find_job, request_cancel

    config = _ops_config(args)
    state_dir = config.daemon.state_dir.absolute()
    status = read_status(config)
    found = find_job(state_dir, status.report if status.up else None, args.job_id)
    if found is None:
        raise JobNotFoundError(
            f"unknown job id {args.job_id}: not pending or running, and not in the journal under {state_dir}",
            hint="`sharderd status` lists pending and running jobs by id.",
        )
    name, state = found
    if state in ("succeeded", "failed", "duplicate", "cancelled"):
        print(
            f"sharderd: job {args.job_id} ({name}) already finished: {state}; nothing to cancel",
            file=sys.stderr,
        )
        return EXIT_FAILED
    request_cancel(state_dir, args.job_id)
    if status.up:
        print(
            f"cancel requested for job {args.job_id} ({name}, {state}); it moves to failed/ once its attempts are stopped"
        )
    else:
        print(
            f"cancel requested for job {args.job_id} ({name}); the daemon is not up ({status.problem}): "
            "it cancels the job when it starts"
        )
    return EXIT_OK


_COMMANDS = {
    "plan": _cmd_plan,
    "shard": _cmd_shard,
    "example-model": _cmd_example,
    "check-config": _cmd_check_config,
    "run": _cmd_run,
    "status": _cmd_status,
    "retry": _cmd_retry,
    "cancel": _cmd_cancel,
}


def main(argv: Sequence[str] | None = None) -> int:
    args, extra = build_parser().parse_known_args(argv)
    if extra:  # the command's own usage, not the root's: argparse would blame ``sharderd`` itself
        args.command_parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return _COMMANDS[args.command](args)
    except SharderdError as err:
        print(f"sharderd: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("sharderd: interrupted", file=sys.stderr)
        return 130
