"""``report.svg.attempt_note``: what an attempt taught, as the HTML report and its chart say it."""

from __future__ import annotations

from sharderd.report.svg import attempt_note


def test_an_overflow_on_a_named_device_notes_that_device_and_its_factor() -> None:
    attempt = {
        "oom": {"kind": "tile", "device": 1, "tile": 7, "bytes_used": 700_000},
        "correction": {"device": 1, "scale_before": [1.0, 1.1], "scale_after": [1.0, 1.4]},
    }
    note = attempt_note(attempt)
    assert note.startswith("OOM (tile) on device 1 tile 7: ")
    assert note.endswith("; device 1 memory × 1.1 → 1.4")
    assert attempt_note(attempt, short=True).endswith("; memory × 1.1 → 1.4")


def test_an_overflow_that_named_no_device_notes_every_device() -> None:
    """A host-stream overflow names no device: its correction scales every device (the HTML report
    of such a job was not written at all when the note read ``device`` as an index)."""
    attempt = {
        "oom": {"kind": "stream", "device": None},
        "correction": {"device": None, "scale_before": [1.0, 1.2], "scale_after": [1.25, 1.5]},
    }
    assert attempt_note(attempt) == "OOM (stream) on a device; every device memory ×1.25"
    assert attempt_note(attempt, short=True) == "a device; memory ×1.25"
