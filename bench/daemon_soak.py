"""Reliability soak of ``sharderd run`` at full size: the kill -9 loop, the burst, the bad-input corpus.

The same functions as the CI tests in ``tests/daemon/test_daemon_faults.py``, at sizes CI cannot afford;
each asserts its own invariants (exactly once, byte-identical results, nothing left behind) and
raises on the first violation, so a finished run is a passed run:

- *kill loop*: ``--jobs`` jobs (a quarter duplicates, a third compiling on the fake PopRT, some
  folders with external data) dropped over ``--kills`` + 1 daemon lives, each but the last ended
  by ``kill -9`` at a seeded random moment;
- *burst*: ``--burst`` different small models (``examples.chain(nodes=8, hidden=4)``) renamed into
  the inbox at once, with the daemon's inotify queue lowered to ``--queue-limit`` events (root
  only; restored at once), RSS sampled from ``/proc/PID/status`` throughout;
- *corpus*: every case of ``tests/corpus.py`` (the 10 GiB sparse model included) dropped into one
  daemon, which must never die and must end each job once;
- *fuzz*: ``--fuzz-inputs`` inputs drawn by kind (``tests/fuzz_inputs.py``: byte flips, truncations,
  broken semantics, odd names, deep nesting, special files, sidecars, valid models, and the kinds
  another change fixes) through one daemon restarted every ``--fuzz-restart-every`` inputs
  (SIGTERM and kill -9 in turn); ``tests/daemon/fuzz_campaign.py`` counts deaths, stuck jobs, bugs
  and broken promises. It reports rather than stops: the table says what held.

Prints a Markdown table (the Reliability section of BENCHMARKS.md); raw numbers go to
``bench/out/daemon_soak.json``. Lowering the inotify queue needs root; without it the burst runs
with the host's limit.

    python bench/daemon_soak.py                              # 60 jobs / 25 kills, 1,000 models, corpus, fuzz
    python bench/daemon_soak.py --skip burst --kills 100 --jobs 120 --seed 3
    python bench/daemon_soak.py --skip kill --skip burst --skip corpus --fuzz-inputs 1000
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import (  # bench/ is on sys.path
    OUT,
    fmt_bytes,
    machine,
    machine_markdown,
    markdown_table,
    write_json,
)

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests" / "daemon"), str(REPO / "tests"), str(REPO)]

from fuzz_campaign import CampaignResult, campaign  # noqa: E402  (after the path set-up)
from fuzz_inputs import KNOWN  # noqa: E402
from test_daemon_faults import (  # noqa: E402
    FLAT_RSS_BYTES,
    BurstResult,
    CorpusResult,
    KillLoopResult,
    burst,
    corpus_through_daemon,
    kill_loop,
    soak_jobs,
)

PHASES = ("kill", "burst", "corpus", "fuzz")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=60, help="jobs in the kill loop (default 60)")
    parser.add_argument("--kills", type=int, default=25, help="kill -9 rounds (default 25)")
    parser.add_argument(
        "--seed", type=int, default=1, help="seed of the kill moments and drop order"
    )
    parser.add_argument(
        "--burst", type=int, default=1000, help="models in the burst (default 1000)"
    )
    parser.add_argument(
        "--distinct", type=int, default=None, help="different contents in the burst (default: all)"
    )
    parser.add_argument(
        "--queue-limit",
        type=int,
        default=16,
        help="inotify max_queued_events for the burst; 0 leaves it",
    )
    parser.add_argument(
        "--fuzz-inputs", type=int, default=1000, help="inputs in the fuzz campaign (default 1000)"
    )
    parser.add_argument(
        "--fuzz-restart-every",
        type=int,
        default=250,
        help="restart the daemon every N inputs, SIGTERM and kill -9 in turn (default 250)",
    )
    parser.add_argument(
        "--fuzz-deadline",
        type=float,
        default=300.0,
        help="seconds after its claim a job is stuck (default 300)",
    )
    parser.add_argument(
        "--skip", action="append", choices=PHASES, default=[], help="leave a phase out (repeatable)"
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="where the daemons' folders go, kept afterwards (default: a temp dir, removed after a passed run)",
    )
    args = parser.parse_args()

    work = args.workdir or Path(tempfile.mkdtemp(prefix="sharderd-soak-"))
    raw: dict[str, Any] = {}
    rows: list[list[object]] = []
    if "kill" not in args.skip:
        print(
            f"kill loop: {args.jobs} jobs, {args.kills} kills, seed {args.seed} ...",
            file=sys.stderr,
            flush=True,
        )
        loop = kill_loop(work / "kill", soak_jobs(args.jobs), kills=args.kills, seed=args.seed)
        raw["kill_loop"] = dataclasses.asdict(loop)
        rows.append(_kill_row(loop, args))
    if "burst" not in args.skip:
        distinct = args.distinct or args.burst
        print(f"burst: {args.burst} models ({distinct} different) ...", file=sys.stderr, flush=True)
        held = burst(
            work / "burst", args.burst, distinct=distinct, queue_limit=args.queue_limit or None
        )
        assert held.rss_end < held.rss_ready + FLAT_RSS_BYTES, held
        raw["burst"] = dataclasses.asdict(held)
        rows.append(_burst_row(held, args))
    if "corpus" not in args.skip:
        print("corpus through one daemon ...", file=sys.stderr, flush=True)
        start = time.monotonic()
        corpus = corpus_through_daemon(work / "corpus")
        raw["corpus"] = {
            **dataclasses.asdict(corpus),
            "seconds": round(time.monotonic() - start, 1),
        }
        rows.append(_corpus_row(corpus, raw["corpus"]["seconds"]))
    kinds_table = None
    if "fuzz" not in args.skip:
        print(f"fuzz campaign: {args.fuzz_inputs} inputs ...", file=sys.stderr, flush=True)
        (work / "fuzz" / "models").mkdir(parents=True)
        fuzz = campaign(
            work / "fuzz",
            args.fuzz_inputs,
            seed=args.seed,
            restart_every=args.fuzz_restart_every,
            deadline_s=args.fuzz_deadline,
        )
        raw["fuzz"] = dataclasses.asdict(fuzz)
        rows.append(_fuzz_row(fuzz, args))
        kinds_table = _fuzz_kinds(fuzz)
    if args.workdir is None:
        shutil.rmtree(work)  # a failed run raised above and keeps its folders for a look
    info = machine()
    _merge_json(
        OUT / "daemon_soak.json",
        raw,
        {"machine": info, "args": {k: str(v) for k, v in vars(args).items()}},
    )
    print(
        markdown_table(
            ("Run", "Size", "Daemon deaths", "Jobs lost", "Held", "Time", "Command"), rows
        )
    )
    if kinds_table is not None:
        print()
        print(kinds_table)
    print()
    print(machine_markdown(info))
    return 0


def _merge_json(path: Path, phases: dict[str, Any], run: dict[str, Any]) -> None:
    """Keep earlier phases' numbers (``--skip`` runs one at a time); each phase carries its own run."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    data.update({name: {**result, **run} for name, result in phases.items()})
    write_json(path, data)


def _kill_row(r: KillLoopResult, args: argparse.Namespace) -> list[object]:
    held = (
        f"{r.kills} kill -9 survived ({r.kills_mid_attempt} mid-attempt, {r.attempts_started} attempts "
        f"started); {r.succeeded} results + {r.duplicates} duplicates, each once; results byte-identical "
        "to a clean run; no temp file, no process left"
    )
    command = f"`python bench/daemon_soak.py --skip burst --skip corpus --jobs {args.jobs} --kills {args.kills} --seed {args.seed}`"
    return [
        "kill -9 loop",
        f"{r.jobs} jobs ({r.distinct} different)",
        0,
        0,
        held,
        f"{r.seconds:.0f} s",
        command,
    ]


def _burst_row(r: BurstResult, args: argparse.Namespace) -> list[object]:
    queue = f"inotify queue {r.queue_limit} events" if r.queue_limit else "inotify queue unchanged"
    held = (
        f"each processed once; {queue}, {r.detected_by_event} seen by an event, the rest by the rescan; "
        f"RSS {fmt_bytes(r.rss_ready)} at ready, {fmt_bytes(r.rss_end)} at the end, peak {fmt_bytes(r.rss_peak)}"
    )
    command = f"`python bench/daemon_soak.py --skip kill --skip corpus --burst {args.burst}`"
    return [
        "burst",
        f"{r.models} models ({r.distinct} different)",
        0,
        0,
        held,
        f"{r.seconds:.0f} s",
        command,
    ]


def _corpus_row(r: CorpusResult, seconds: float) -> list[object]:
    reasons = ", ".join(f"{k} {v}" for k, v in r.reasons.items())
    bugs = (
        f"; internal_error only for reported bugs ({', '.join(r.internal_errors)})"
        if r.internal_errors
        else ""
    )
    held = f"{r.jobs} jobs: {r.failed} failed with a reason ({reasons}), {r.succeeded} valid ones published{bugs}"
    return [
        "bad-input corpus",
        f"{r.entries} inputs",
        r.daemon_deaths,
        r.lost,
        held,
        f"{seconds:.0f} s",
        "`python bench/daemon_soak.py --skip kill --skip burst`",
    ]


def _fuzz_row(r: CampaignResult, args: argparse.Namespace) -> list[object]:
    median, p99, longest = r.latency_s
    held = (
        f"{r.jobs} jobs, each ended once; {r.restarts} restarts (SIGTERM and kill -9 in turn), each "
        f"clean; stuck {len(r.stuck)} (+{len(r.known_stuck)} known, cancelled); bugs "
        f"{len(r.internal_errors)} (+{len(r.known_internal)} known); broken promises "
        f"{len(r.problems)}; claim to end median {median:g} s, p99 {p99:g} s, max {longest:g} s; "
        f"RSS {fmt_bytes(r.rss_bytes[0])} at ready, {fmt_bytes(r.rss_bytes[1])} at the end"
    )
    command = (
        "`python bench/daemon_soak.py --skip kill --skip burst --skip corpus "
        f"--fuzz-inputs {args.fuzz_inputs} --fuzz-restart-every {args.fuzz_restart_every} --seed {args.seed}`"
    )
    lost = sum("never ended" in p for p in r.problems)
    return [
        "fuzz campaign",
        f"{r.inputs} inputs",
        r.deaths,
        lost,
        held,
        f"{r.seconds:.0f} s",
        command,
    ]


def _fuzz_kinds(r: CampaignResult) -> str:
    rows = []
    for kind, counts in r.by_kind.items():
        outcomes = ", ".join(f"{k} {v}" for k, v in counts.items() if k != "inputs")
        known = f" (known: {KNOWN[kind]})" if kind in KNOWN else ""
        rows.append([kind, counts.get("inputs", 0), outcomes + known])
    findings = [*r.stuck, *r.internal_errors, *r.problems]
    table = markdown_table(("Kind", "Inputs", "Outcomes"), rows)
    known = [w.split(":", 2)[0] + ")" for w in [*r.known_stuck, *r.known_internal]]
    if known:
        table += "\n\nKnown (another change fixes them): " + ", ".join(known)
    if findings:
        table += "\n\nFindings: " + "; ".join(findings[:50])
    return table


if __name__ == "__main__":
    sys.exit(main())
