"""``python -m sharderd.job.planworker``: a PlanService behind JSON lines on stdin/stdout.

The first line configures it (model, plan config, target, what to serialize); each later line is ``summary``,
``plan`` or ``probe``. Every answer is one line ``{"ok": true, "result": ...}`` or ``{"ok": false, "error":
...}``. Expected failures are answers; anything else is a crash the parent reports.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from sharderd.config import PlanConfig, load_table
from sharderd.errors import SharderdError
from sharderd.job.codec import encode_error, encode_planned, encode_probed, encode_summary
from sharderd.job.session import (
    PlanService,
    Serialize,
    plan_request_from,
    probe_request_from,
)
from sharderd.target import Target


def _answer(payload: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(payload) + "\n")
    sys.stdout.flush()


def main() -> int:
    service: PlanService | None = None
    for line in sys.stdin:
        message = json.loads(line)
        try:
            if service is None:
                plan = message["plan"]
                config = load_table(PlanConfig, plan, "plan worker")
                serialize = message.get("serialize")
                service = PlanService(
                    Path(message["model"]),
                    config,
                    Target(**message["target"]),
                    None if serialize is None else Serialize(**serialize),
                )
                result: Any = {"ready": True}
            elif message["op"] == "summary":
                result = encode_summary(service.summary())
            elif message["op"] == "plan":
                result = encode_planned(service.plan(plan_request_from(message)))
            elif message["op"] == "probe":
                result = encode_probed(service.probe(probe_request_from(message)))
            else:
                raise SharderdError(f"unknown plan worker op {message.get('op')!r}")
        except SharderdError as err:
            _answer({"ok": False, "error": encode_error(err)})
            continue
        _answer({"ok": True, "result": result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
