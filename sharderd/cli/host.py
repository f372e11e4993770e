"""The commands that set up and check a host for the service: ``sdk-env``, ``doctor`` and
``check-config`` (which refuses what ``run`` would refuse, with ``run``'s own messages)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING

from sharderd.config import load_config
from sharderd.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK

if TYPE_CHECKING:
    from sharderd.daemon.preflight import Host

__all__ = ["cmd_check_config", "cmd_doctor", "cmd_sdk_env"]

_MARK = {"ok": "ok  ", "warn": "warn", "fail": "FAIL"}


def cmd_check_config(args: argparse.Namespace) -> int:
    """Print the effective config; then every refusal ``run`` would make, exit 2 when any."""
    from sharderd.config import describe_config
    from sharderd.daemon.doctor import service_env
    from sharderd.daemon.preflight import failures

    config = load_config(args.file)
    print(describe_config(config), end="")
    sys.stdout.flush()
    host = _host(service_env(args.env_file).env)
    refused = failures(config, host)
    for err in refused:
        print(f"sharderd: error: {err}", file=sys.stderr)
    return EXIT_BAD_INPUT if refused else EXIT_OK


def cmd_doctor(args: argparse.Namespace) -> int:
    """One line per finding; exit 1 when any failed."""
    from sharderd.cli.status import ops_config
    from sharderd.daemon.doctor import diagnose, service_env

    config = ops_config(args.config)
    service = service_env(args.env_file)
    findings = diagnose(config, service, _host(service.env))
    if args.json:
        print(json.dumps([asdict(f) for f in findings], indent=1))
    else:
        where = config.source or "built-in defaults"
        print(f"sharderd doctor: config {where}, environment file {service.env_file}")
        for f in findings:
            print(f"{_MARK[f.level]}  {f.subject:<8} {f.text}")
            if f.fix and f.level != "ok":
                print(f"      {'':<8} fix: {f.fix}")
    return EXIT_FAILED if any(f.level == "fail" for f in findings) else EXIT_OK


def cmd_sdk_env(args: argparse.Namespace) -> int:
    """Write the unit's ``EnvironmentFile=`` from the SDK's enable script."""
    from sharderd.backends.poplar_sdk import render_env_file, sdk_environment, sdk_root
    from sharderd.fsutil import atomic_write

    env = sdk_environment(args.script)
    found = sdk_root([str(args.script.resolve()), *env.variables.values()])
    text = render_env_file(env, version=found[1] if found else None)
    if str(args.out) == "-":
        print(text, end="")
        out = "stdout"
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(args.out, text, mode=0o644, exact_mode=True)
        out = str(args.out)
    say = sys.stderr if out == "stdout" else sys.stdout
    names = ", ".join(env.variables) or "none"
    print(f"wrote {out}: {len(env.variables)} variable(s) from {args.script}: {names}", file=say)
    for what, keys in (
        ("unset by the script (a service never has them)", env.unset),
        ("exported but not variables systemd can take, left out", env.skipped),
        ("empty entries (the working directory) dropped from", env.cleaned),
    ):
        if keys:
            print(f"note: {what}: {', '.join(keys)}", file=say)
    if out != "stdout":
        print(
            "next: sudo systemctl restart sharderd; check with: sudo -u sharderd sharderd doctor",
            file=say,
        )
    return EXIT_OK


def _host(env: Mapping[str, str]) -> Host:
    """The host as the service will see it: poprt imported with ``env``."""
    from sharderd.backends.poplar_sdk import probe_poprt
    from sharderd.daemon.preflight import Host

    return Host(probe=lambda: probe_poprt(env))
