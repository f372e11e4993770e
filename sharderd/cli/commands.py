"""``sharderd``'s commands. Thin: parse, call the engine or the daemon, print, exit.

Exit codes (other tools rely on them): 0 done, 1 failed (compile or verification), 2 bad input or
usage, 3 does not fit (proven), 4 backend unavailable, 5 no fitting split found (not proven).
A reader that closes stdout early (``sharderd status --json | head``) ends any command quietly
with 141, the status of a process killed by SIGPIPE.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sharderd.cli import host
from sharderd.cli.parser import build_parser, config_from_args, device_request
from sharderd.config import Config, load_config, search_options
from sharderd.errors import (
    EXIT_FAILED,
    EXIT_OK,
    ConfigError,
    NoSplitError,
    NotProvenError,
    SharderdError,
)

if TYPE_CHECKING:
    from sharderd.job.run import JobSpec

__all__ = ["main"]


def _cmd_plan(args: argparse.Namespace) -> int:
    from sharderd.engine import analyze_file, fitting_devices, make_auto_plan
    from sharderd.plan.infeasible import overfull_not_proven, with_fitting_hint
    from sharderd.report.assumptions import defaulted_dims
    from sharderd.report.build import (
        model_facts,
        plan_section,
        report_dict,
        serialized_section,
        trial_section,
    )
    from sharderd.report.markdown import render_markdown
    from sharderd.shard.serialize_bottleneck import planned

    config = config_from_args(args)
    devices, auto = device_request(args)
    target = config.target(args.target)
    started = time.perf_counter()
    analysis = analyze_file(args.model, config.plan)
    analyzed = time.perf_counter()
    model = model_facts(analysis)
    assumed = defaulted_dims(model["inputs"], config)
    _say_assumed(assumed)
    base: dict[str, Any] = {
        "model": model,
        "warnings": [*assumed, *analysis.warnings],
        "target": target,
        "batch_size": config.plan.batch_size,
    }
    try:
        chosen, plan = planned(analysis, config.plan, target, devices)
        if auto:  # serialization is decided at the most devices allowed; then the fewest
            plan = make_auto_plan(chosen.analysis, target, devices, config.plan)
    except NoSplitError as err:
        if isinstance(err, NotProvenError) and err.node is None:
            err = with_fitting_hint(
                err, devices, *fitting_devices(analysis, target, devices, config.plan)
            )
        if args.json:  # the report of a plan that failed: no plan, the error
            status = "does_not_fit" if err.proven else "not_proven"
            print(json.dumps(report_dict(**base, plan=None, status=status, error=err.to_dict())))
        raise err from None
    analysis, serialized = chosen.analysis, chosen.records
    stage_of = dict(zip(analysis.flow.node_names, map(int, plan.assignment), strict=True))
    extra: dict[str, Any] = {}
    if serialized:
        extra["serialized"] = serialized_section(serialized, stage_of)
    if chosen.trial is not None:
        extra["serialization_tried"] = trial_section(chosen.trial)
    error = None
    if plan.method == "overfull":
        error = overfull_not_proven(
            plan, target, *fitting_devices(analysis, target, plan.devices, config.plan)
        )
    report = report_dict(
        **base,
        timings_s={"load_and_analyze": analyzed - started, "plan": time.perf_counter() - analyzed},
        plan=plan_section(plan, config.plan.batch_size),
        status="planned" if error is None else "not_proven",
        error=None if error is None else error.to_dict(),
        extra=extra or None,
    )
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(render_markdown(report), end="")
    _say_fewest(report, args)
    if error is not None:
        raise error
    return EXIT_OK


def _say_fewest(report: dict[str, Any], args: argparse.Namespace) -> None:
    """One line on stderr when fewer devices than asked for keep the predicted throughput, or
    which count ``--devices auto`` chose."""
    plan = report.get("plan") or {}
    fewest, devices = plan.get("fewest_devices"), plan.get("devices")
    if fewest is None or devices is None:
        return
    band = f"{plan['fewest_devices_band']:.0%}"
    if plan.get("max_devices") is not None:
        print(
            f"sharderd: --devices auto chose {devices} of at most {plan['max_devices']} devices: "
            f"the fewest whose predicted throughput is within {band} of a plan on "
            f"{plan['max_devices']}",
            file=sys.stderr,
        )
    elif fewest < devices:
        print(
            f"sharderd: {fewest} device(s) give the predicted throughput of these {devices} "
            f"(within {band}); plan on them with --devices {fewest}, or let sharderd choose with "
            f"--devices auto --max-devices {devices}",
            file=sys.stderr,
        )


def _cmd_shard(args: argparse.Namespace) -> int:
    import anyio

    from sharderd.cli.progress import progress
    from sharderd.filenames import MAX_NAME_BYTES, safe_name
    from sharderd.job.outdir import check_model_file, occupied
    from sharderd.job.run import JobFailed, JobSpec, run_local
    from sharderd.report.markdown import render_markdown

    config = config_from_args(args)
    if args.parallel is not None and args.parallel < 1:
        raise ConfigError(f"--parallel must be >= 1, got {args.parallel}")
    if args.max_attempts is not None and args.max_attempts < 1:
        raise ConfigError(f"--max-attempts must be >= 1, got {args.max_attempts}")
    if args.attempt_timeout is not None and args.attempt_timeout <= 0:
        raise ConfigError(f"--attempt-timeout must be > 0, got {args.attempt_timeout}")
    search = search_options(
        config,
        backend=args.backend,
        optimal_perf=args.optimal_perf or None,  # the flag can only turn it on
        max_attempts=args.max_attempts,
        parallel=args.parallel,
        attempt_timeout=args.attempt_timeout,
    )
    devices, auto = device_request(args)
    given = args.model.name.removesuffix(".onnx")
    stem = safe_name(given)
    if stem != given:  # said, not silent: the files are not named as the model is
        print(
            f"sharderd: the output files are named {stem}.*: the model's name is not printable "
            f"UTF-8 or longer than {MAX_NAME_BYTES} bytes (room for the suffixes within the "
            "filesystem's 255)",
            file=sys.stderr,
        )
    out_dir = args.out or Path(f"{stem}.sharded")
    check_model_file(args.model)
    problem = None if args.overwrite else occupied(out_dir, stem)
    if problem is not None:
        raise ConfigError(
            problem,
            hint="add --overwrite to replace it, or name another folder with --out",
        )
    spec = JobSpec(
        model=args.model,
        out_dir=out_dir,
        stem=stem,
        devices=devices,
        auto_devices=auto,
        config=config,
        search=search,
        target=args.target,
    )
    with progress(quiet=args.quiet, json_mode=args.json) as emit:
        try:
            result = anyio.run(partial(run_local, spec, emit=emit))
        except JobFailed as failed:
            if failed.report is not None:
                _say_assumed(_assumed(failed.report, spec))
                what = "the failed attempts" if failed.report.get("attempts") else "the failed job"
                print(f"sharderd: report of {what}: {out_dir}/report.md", file=sys.stderr)
            raise failed.error from None
    _say_assumed(_assumed(result.report, spec))
    if args.json:
        print(json.dumps(result.report, indent=1))
    elif not args.quiet:
        print(render_markdown(result.report), end="")
        print(f"wrote {out_dir}/")
    if not args.quiet:
        _say_fewest(result.report, args)
    return EXIT_OK


def _assumed(report: dict[str, Any], spec: JobSpec) -> list[str]:
    """The report's warnings about what was assumed, recomputed from its facts (never its text)."""
    from sharderd.backends.registry import fallback_warnings
    from sharderd.report.assumptions import defaulted_dims

    target = spec.config.target(spec.target)
    fallback = fallback_warnings(spec.search.backend, str(report.get("backend")), target)
    return [*fallback, *defaulted_dims(report["model"]["inputs"], spec.config)]


def _say_assumed(warnings: Sequence[str]) -> None:
    """A ``warning:`` line on stderr for each (also with ``--json`` and ``--quiet``)."""
    for text in warnings:
        print(f"sharderd: warning: {text}", file=sys.stderr)


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


def _cmd_run(args: argparse.Namespace) -> int:
    """The daemon; SIGTERM or SIGINT stop it cleanly (exit 0), also during start-up."""
    import anyio

    from sharderd.daemon.service import serve
    from sharderd.logs import configure_logging, get_logger

    # Until serve() installs its own handlers, a stop request interrupts start-up before anything
    # was claimed: turn SIGTERM into the same KeyboardInterrupt as SIGINT and exit cleanly.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    configure_logging()
    config = load_config(args.config) if args.config else Config()
    try:
        anyio.run(serve, config)
    except KeyboardInterrupt:
        print("sharderd: stopped during start-up", file=sys.stderr)
    except ConfigError as err:  # refused at start: say it in the log too, not on stderr alone
        get_logger(__name__).error("daemon.refused", message=err.message, hint=err.hint)
        raise
    return EXIT_OK


def _ops_config(args: argparse.Namespace) -> Config:
    from sharderd.cli.status import ops_config

    return ops_config(args.config)


def _cmd_status(args: argparse.Namespace) -> int:
    from sharderd.cli.status import read_status, render_text, status_json

    status = read_status(_ops_config(args))
    if args.json:
        print(json.dumps(status_json(status), indent=1))
    else:
        print(render_text(status), end="")
    return EXIT_OK if status.up else EXIT_FAILED


def _cmd_retry(args: argparse.Namespace) -> int:
    from sharderd.daemon.retry import retry_failed
    from sharderd.filenames import text

    daemon = _ops_config(args).daemon
    result = retry_failed(
        daemon.state_dir.absolute() / "failed", daemon.inbox.absolute(), args.name
    )
    moved = " and ".join(text(str(p)) for p in result.moved)  # a name may not be UTF-8
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
    "check-config": host.cmd_check_config,
    "doctor": host.cmd_doctor,
    "sdk-env": host.cmd_sdk_env,
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
        code = _COMMANDS[args.command](args)
        sys.stdout.flush()  # here, not at exit: a closed pipe is then seen below
        return code
    except SharderdError as err:
        print(f"sharderd: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("sharderd: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return _stdout_closed()


def _stdout_closed() -> int:
    """The reader of stdout went away (``sharderd status --json | head``): stop quietly, as a
    program killed by SIGPIPE would, with its exit status 141 (128 + SIGPIPE)."""
    # Python flushes stdout again at exit and would print that error: point it at /dev/null.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + signal.SIGPIPE
