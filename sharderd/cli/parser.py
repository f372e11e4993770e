"""The ``sharderd`` argument parser, and the plan config its options amend.

``plan`` and ``shard`` take ``[plan]`` keys as flags too (``--batch-size``, ``--dim``, ...);
``config_from_args`` applies them on top of ``--config`` (or the defaults), so a command sees one
``Config``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from sharderd import __version__
from sharderd.backends.poplar_sdk import ENV_FILE
from sharderd.config import Config, amend_plan, load_config
from sharderd.errors import ConfigError

__all__ = ["build_parser", "config_from_args", "device_request", "devices_arg"]

_DESCRIPTION = (
    "Split an ONNX model into pipeline stages, one accelerator each (IPU via PopRT, or checked "
    "with onnxruntime), or run the inbox daemon that does it for every model dropped in."
)


def devices_arg(text: str) -> int | str:
    """``--devices``: a count, or ``auto``."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a device count or auto, got {text!r}") from None


def device_request(args: argparse.Namespace) -> tuple[int, bool]:
    """(devices, auto): with ``--devices auto`` the count is ``--max-devices``."""
    if args.devices != "auto":
        if args.max_devices is not None:
            raise ConfigError(
                "--max-devices applies to --devices auto only",
                hint=f"drop --max-devices, or use --devices auto --max-devices {args.max_devices}",
            )
        return int(args.devices), False
    if args.max_devices is None:
        raise ConfigError(
            "--devices auto needs --max-devices N, the most devices it may use",
            hint="add --max-devices 8 (or the number of devices you can give the model)",
        )
    if args.max_devices < 1:
        raise ConfigError(f"--max-devices must be >= 1, got {args.max_devices}")
    return int(args.max_devices), True


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", type=Path, help="the .onnx file (external data beside it)")
    p.add_argument(
        "--devices",
        "-n",
        type=devices_arg,
        required=True,
        help="pipeline stages, one device each; auto: the fewest (up to --max-devices) that keep "
        "the predicted throughput of a plan on --max-devices, so the other devices stay free",
    )
    p.add_argument(
        "--max-devices",
        type=int,
        help="with --devices auto: the most devices it may use (required there)",
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
    p.add_argument(
        "--no-serialize",
        action="store_true",
        help="never rewrite a node into pieces, too big for one device or holding the bottleneck up (plan.serialize = false)",
    )


def _command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, **kwargs: Any
) -> argparse.ArgumentParser:
    """A command's parser. No abbreviations anywhere: ``--device 4`` is an error, not
    ``--devices 4``, and a flag added later cannot change what someone's script meant."""
    return sub.add_parser(name, allow_abbrev=False, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sharderd",
        allow_abbrev=False,
        description=_DESCRIPTION,
        epilog="Exit codes: 0 done, 1 compile or verification failed, 2 bad input or usage, 3 does not fit "
        "(proven: the weights alone, or one node compiled alone), 4 backend unavailable, 5 no fitting "
        "split found (not proven). `sharderd COMMAND --help` shows a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"sharderd {__version__}")
    ops_config = "the daemon's sharderd.toml (default: /etc/sharderd/sharderd.toml if it exists, else built-in defaults)"
    sub = parser.add_subparsers(dest="command", required=True)

    p = _command(
        sub,
        "plan",
        help="print the plan; write nothing",
        epilog="plan never compiles or runs the model; to prove a plan (--backend, --optimal-perf, "
        "--out, ...) use `sharderd shard`.",
    )
    _add_common(p)
    p.add_argument("--json", action="store_true", help="print report.json's content")

    p = _command(sub, "shard", help="plan, annotate, prove (backend) and write the sharded model")
    _add_common(p)
    p.add_argument("--out", "-o", type=Path, help="output folder (default ./<stem>.sharded/)")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="write into an output folder that holds an earlier result, replacing its files of the "
        "same names (others stay); without it such a folder is refused",
    )
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

    p = _command(sub, "example-model", help="write a model generated locally (no download)")
    kind = p.add_argument(
        "kind", nargs="?", default="transformer", help="one of %(kinds)s (default %(default)s)"
    )
    # argparse fills %(kinds)s from the action's attributes, only when help is printed: the
    # builders import onnx, which no other command's start-up should pay for.
    setattr(kind, "kinds", _ExampleKinds())  # noqa: B010 (Action has no such attribute)
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

    env_file_help = (
        "the unit's EnvironmentFile= (the Poplar SDK's variables, written by `sharderd sdk-env`); "
        "poprt is imported with it (default: %(default)s)"
    )
    p = _command(
        sub,
        "check-config",
        help="validate a config file, print the effective config, and refuse (exit 2) what "
        "`sharderd run` would refuse, with its messages",
    )
    p.add_argument("file", nargs="?", type=Path, default=Path("sharderd.toml"))
    p.add_argument("--env-file", type=Path, default=ENV_FILE, help=env_file_help)

    p = _command(
        sub,
        "doctor",
        help="is this host ready for the service: run's checks, poprt and its SDK, IPUs, folders "
        "(exit 1 when something fails; each failure says its fix)",
    )
    p.add_argument("--config", "-c", type=Path, help=ops_config)
    p.add_argument("--env-file", type=Path, default=ENV_FILE, help=env_file_help)
    p.add_argument("--json", action="store_true", help="the findings as JSON")

    p = _command(
        sub,
        "sdk-env",
        help="write the service's EnvironmentFile= from the Poplar SDK's enable script: the "
        "variables it adds or changes in a clean bash",
    )
    p.add_argument(
        "script", type=Path, help="the SDK's enable script, e.g. /opt/poplar_sdk-VERSION/enable"
    )
    p.add_argument(
        "--out",
        "-o",
        type=Path,
        default=ENV_FILE,
        help="the file to write, - for stdout (default: %(default)s)",
    )

    p = _command(sub, "run", help="run the inbox daemon (JSON logs on stdout; the systemd service)")
    p.add_argument("--config", "-c", type=Path, help="sharderd.toml (default: built-in defaults)")

    p = _command(
        sub, "status", help="is the daemon up, and its queue and pool (exit 1 when it is not up)"
    )
    p.add_argument("--config", "-c", type=Path, help=ops_config)
    p.add_argument("--json", action="store_true", help="print the verdict and status.json as JSON")

    p = _command(
        sub, "retry", help="move a failed job's input from state_dir/failed/ back into the inbox"
    )
    p.add_argument("name", help="the job's folder in state_dir/failed/")
    p.add_argument("--config", "-c", type=Path, help=ops_config)

    p = _command(
        sub, "cancel", help="ask the daemon to cancel a pending or running job (it goes to failed/)"
    )
    p.add_argument("job_id", help="as in the log's job_id and `sharderd status`")
    p.add_argument("--config", "-c", type=Path, help=ops_config)
    for command in sub.choices.values():
        command.set_defaults(command_parser=command)
    return parser


class _ExampleKinds:
    """The names of ``sharderd.examples.EXAMPLES``, read when ``str()`` asks (help is printed)."""

    def __str__(self) -> str:
        from sharderd.examples import EXAMPLES

        return ", ".join(EXAMPLES)


def config_from_args(args: argparse.Namespace) -> Config:
    """The config a model command runs with: ``--config`` or the defaults, amended by its flags."""
    config = load_config(args.config) if getattr(args, "config", None) else Config()
    return amend_plan(
        config,
        batch_size=getattr(args, "batch_size", None),
        safety_margin=getattr(args, "safety_margin", None),
        dims=dict(_parse_dim(text) for text in getattr(args, "dim", None) or ()),
        input_shapes=dict(_parse_input_shape(t) for t in getattr(args, "input_shape", None) or ()),
        precision=getattr(args, "precision", None),
        name_nodes=getattr(args, "name_nodes", False),
        keep_dynamic=getattr(args, "keep_dynamic", False),
        no_serialize=getattr(args, "no_serialize", False),
    )


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
