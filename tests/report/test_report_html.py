"""report.html as a person sees it: real ``sharderd shard`` runs, the page rendered by headless
Chromium, then checked in the DOM Chromium built and in the pixels of its screenshot.

Needs Debian's ``chromium`` (.ci/run installs it). Refresh docs/report.png with
``SHARDERD_UPDATE_REPORT_PNG=1 python -m pytest tests/report/test_report_html.py``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sharderd import examples
from sharderd.units import fmt_bytes, fmt_seconds

REPO = Path(__file__).resolve().parents[2]
FAKE = REPO / "tests" / "fake_poprt"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="Debian's chromium is not installed (apt-get install -y chromium; .ci/run does this)",
)
HOSTILE = '<script>document.documentElement.dataset.pwned="1"</script> & <b>'
"""A node name that is markup: it must reach the page as text."""
TILES = 24
IPU_CONFIG = f'[target]\nname = "mini"\n\n[targets.mini]\nbase = "ipu-mk2"\ntiles = {TILES}\nmemory_bytes = {TILES * 638976}\n\n[search]\nkill_grace = 0.5\n'
CPU_CONFIG = '[target]\nname = "cpu"\n\n[plan]\ncost_model = "measured"\n'
WINDOW = (1280, 2000)


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    content: list[Element | str] = field(default_factory=list)

    def iter(self) -> Iterator[Element]:
        yield self
        for c in self.content:
            if isinstance(c, Element):
                yield from c.iter()

    def find_all(self, tag: str, cls: str | None = None) -> list[Element]:
        return [
            e
            for e in self.iter()
            if e.tag == tag and (cls is None or cls in e.attrs.get("class", "").split())
        ]

    def one(self, tag: str, cls: str | None = None) -> Element:
        found = self.find_all(tag, cls)
        assert len(found) == 1, f"expected one <{tag} class={cls}>, found {len(found)}"
        return found[0]

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.content)


class _TreeBuilder(HTMLParser):
    VOID = frozenset({"meta", "br", "img", "input", "link", "hr", "wbr", "source"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Element("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].content.append(element)
        if tag not in self.VOID:
            self.stack.append(element)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.stack[-1].content.append(Element(tag, {k: v or "" for k, v in attrs}))

    def handle_endtag(self, tag: str) -> None:
        for depth in range(len(self.stack) - 1, 0, -1):
            if self.stack[depth].tag == tag:
                del self.stack[depth:]
                return

    def handle_data(self, data: str) -> None:
        self.stack[-1].content.append(data)


def parse(html: str) -> Element:
    builder = _TreeBuilder()
    builder.feed(html)
    builder.close()
    return builder.root


def chromium(page: Path, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [
        CHROMIUM or "chromium",
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--force-device-scale-factor=1",
        f"--user-data-dir={profile}",
        *args,
        page.resolve().as_uri(),
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=90, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


@dataclass(frozen=True)
class Run:
    out: Path
    report: dict[str, Any]
    dom: Element
    html: str


def shard(
    tmp: Path,
    model: Path,
    config: str,
    devices: int,
    *extra: str,
    env: dict[str, str] | None = None,
    expect: int = 0,
) -> Run:
    (tmp / "sharderd.toml").write_text(config)
    out = tmp / "out"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_POPRT")}
    environ.update(PYTHONPATH=os.pathsep.join([str(FAKE), str(REPO)]), **(env or {}))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sharderd.cli",
            "shard",
            str(model),
            "--devices",
            str(devices),
            "--config",
            str(tmp / "sharderd.toml"),
            "--out",
            str(out),
            "--quiet",
            *extra,
        ],
        env=environ,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == expect, proc.stderr
    page = out / "report.html"
    dom = parse(chromium(page, tmp / "profile", "--dump-dom").stdout)
    return Run(
        out, json.loads((out / "report.json").read_text()), dom, page.read_text(encoding="utf-8")
    )


def poprt_env(tmp: Path, gather_code_bytes: int) -> dict[str, str]:
    return {
        "FAKE_POPRT_TILES": str(TILES),
        "FAKE_POPRT_LOG": str(tmp / "compiles.jsonl"),
        "FAKE_POPRT_MODE": "normal",
        "FAKE_POPRT_TRUTH": json.dumps({"code_bytes": {"Gather": gather_code_bytes}}),
    }


@pytest.fixture(scope="module")
def ipu_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "mid.onnx"
    return examples.save(examples.transformer(layers=6, hidden=256, seq=128, vocab=1000), path)


@pytest.fixture(scope="module")
def oom_run(ipu_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The fake compiler's code for Gather is far larger than predicted: device 0 runs out, then a re-plan fits."""
    tmp = tmp_path_factory.mktemp("oom")
    return shard(tmp, ipu_model, IPU_CONFIG, 5, "--backend", "poprt", env=poprt_env(tmp, 4_500_000))


@pytest.fixture(scope="module")
def measured_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """onnxruntime proves and verifies a model whose node names are markup, one node left unnamed."""
    tmp = tmp_path_factory.mktemp("measured")
    model = examples.transformer(layers=2, hidden=32, heads=4, seq=8, vocab=50)
    for i, node in enumerate(model.graph.node):
        node.name = "" if i == 3 else f"{HOSTILE}{i}"
    path = examples.save(model, tmp / "hostile.onnx")
    return shard(tmp, path, CPU_CONFIG, 3, "--backend", "onnxruntime", "--name-nodes")


def test_report_html_is_written_beside_the_json_and_needs_no_network(oom_run: Run) -> None:
    """Every shard job writes report.html next to report.json: one file, no scripts, nothing fetched."""
    assert (oom_run.out / "report.md").is_file()
    assert (
        re.search(r"<script|<link|<img|<iframe|\bsrc=|\bhref=|url\(|@import", oom_run.html, re.I)
        is None
    )
    assert set(re.findall(r"https?://[^\"' ]+", oom_run.html)) == {"http://www.w3.org/2000/svg"}


def test_header_facts_match_the_report(oom_run: Run) -> None:
    """Status, bottleneck, lower bound and throughput in the header are report.json's numbers."""
    plan, dom = oom_run.report["plan"], oom_run.dom
    facts = {
        div.attrs["data-fact"]: div.one("dd").text()
        for div in dom.find_all("div")
        if "data-fact" in div.attrs
    }
    assert dom.one("span", "status").text() == oom_run.report["status"] == "compiled"
    assert (
        facts["bottleneck"]
        == f"stage {plan['slowest_stage']}, {fmt_seconds(plan['bottleneck_s'])} per batch"
    )
    assert (
        facts["bound"]
        == f"{fmt_seconds(plan['lower_bound_s'])} (ratio {plan['ratio_to_bound']:.3f})"
    )
    assert facts["throughput"].startswith(f"{plan['predicted_throughput_per_s']:.1f} samples/s")
    # What the split is optimal over, in the report's own words (docs/planning.md).
    assert plan["claim"] and facts["split"].endswith(plan["claim"])
    assert facts["split"].startswith(plan["method"])
    assert plan["claim"] in (oom_run.out / "report.md").read_text()
    assert (
        facts["target"].startswith("mini")
        and facts["backend"] == "poprt"
        and facts["devices"] == "5"
    )


def test_one_memory_chart_per_device_with_the_planned_bytes(oom_run: Run) -> None:
    """Each device has one bar whose weights/activations/code are the plan's bytes; the most
    corrected device's budget line sits furthest left, and each corrected one says so."""
    stages = oom_run.report["plan"]["stages"]
    figures = oom_run.dom.find_all("figure", "device")
    assert (
        [int(f.attrs["data-stage"]) for f in figures]
        == [s["index"] for s in stages]
        == list(range(5))
    )
    budget_x = []
    for figure, stage in zip(figures, stages, strict=True):
        chart = figure.one("svg", "memory-chart")
        segs = {
            r.attrs["class"].split()[1]: int(r.attrs["data-bytes"])
            for r in chart.find_all("rect", "seg")
        }
        assert segs == {
            "seg-weights": stage["weight_bytes"],
            "seg-activations": stage["activation_bytes"],
            "seg-code": stage["code_bytes"],
        }
        assert sum(segs.values()) == stage["memory_bytes"]
        assert figure.one("span", "used").text() == fmt_bytes(stage["memory_bytes"])
        line = chart.one("line", "budget")
        width = float(chart.one("rect", "capacity").attrs["width"])
        budget_x.append(float(line.attrs["x1"]))
        assert budget_x[-1] == pytest.approx(
            8 + width * stage["budget_bytes"] / stage["capacity_bytes"], abs=0.1
        )
        assert chart.find_all("title")[0].text() == f"Memory of device {stage['index']}"
    scales = oom_run.report["plan"]["memory_scale"]
    most = max(range(5), key=lambda s: scales[s])
    assert scales[most] > 1.5  # the Gather's nodes, wherever the re-plan put them
    assert budget_x[most] == min(budget_x)
    for figure, scale in zip(figures, scales, strict=True):
        assert ("learned correction" in figure.one("figcaption").text()) == (scale != 1.0)


def test_model_strip_marks_each_cut_with_its_bytes(oom_run: Run) -> None:
    """The strip has one block per stage sized by node count and one labelled tick per cut."""
    plan = oom_run.report["plan"]
    strip = oom_run.dom.one("svg", "model-strip")
    blocks = strip.find_all("rect", "stage")
    widths = [float(b.attrs["width"]) for b in blocks]
    assert len(blocks) == plan["devices"]
    per_node = [w / s["num_nodes"] for w, s in zip(widths, plan["stages"], strict=True)]
    assert max(per_node) - min(per_node) < 0.01
    assert [blocks.index(b) for b in strip.find_all("rect", "slowest")] == [plan["slowest_stage"]]
    cuts = strip.find_all("g", "cut")
    assert [int(c.attrs["data-bytes"]) for c in cuts] == [c["bytes"] for c in plan["cuts"]] and len(
        cuts
    ) == 4
    assert [c.one("text").text() for c in cuts] == [fmt_bytes(c["bytes"]) for c in plan["cuts"]]


def test_utilisation_chart_has_a_bar_per_stage_at_its_time_over_the_slowest(oom_run: Run) -> None:
    """report.json's per-stage utilisation is each stage's time over the bottleneck; the chart
    draws one bar per stage at that height (the slowest at the 100% line) and the stage table
    prints it."""
    plan = oom_run.report["plan"]
    stages = plan["stages"]
    assert [s["utilisation"] for s in stages] == pytest.approx(
        [s["time_s"] / plan["bottleneck_s"] for s in stages], rel=1e-12
    )
    assert stages[plan["slowest_stage"]]["utilisation"] == pytest.approx(1.0)
    bars = oom_run.dom.one("svg", "utilisation-chart").find_all("rect", "bar-utilisation")
    assert [float(b.attrs["data-utilisation"]) for b in bars] == [s["utilisation"] for s in stages]
    heights = [float(b.attrs["height"]) for b in bars]
    tallest = heights[plan["slowest_stage"]]
    assert max(heights) == tallest
    for h, s in zip(heights, stages, strict=True):
        assert h == pytest.approx(tallest * s["utilisation"], abs=0.1)
    table = oom_run.dom.one("table", "stages").text()
    assert all(f"{s['utilisation']:.0%}" in table for s in stages)


def test_attempts_timeline_shows_the_oom_and_its_correction(oom_run: Run) -> None:
    """The failed attempt is a red bar naming the device and bytes of the OOM and the correction it taught."""
    attempts = oom_run.report["attempts"]
    timeline = oom_run.dom.one("svg", "attempts-timeline")
    bars = timeline.find_all("rect", "attempt")
    assert [b.attrs["class"].split()[1] for b in bars] == [
        f"outcome-{a['outcome']}" for a in attempts
    ]
    assert [b.attrs["fill"] for b in bars[:2]] == ["#c62828", "#2e7d32"]
    oom, corr = attempts[0]["oom"], attempts[0]["correction"]
    text = timeline.text()
    assert f"device {oom['device']} tile {oom['tile']}: {fmt_bytes(oom['bytes_used'])} used" in text
    assert f"× {corr['scale_before'][0]:.3g} → {corr['scale_after'][0]:.3g}" in text
    assert len(oom_run.dom.one("table", "attempts").find_all("tr")) == len(attempts) + 1


def test_measured_times_and_verification_are_shown(measured_run: Run) -> None:
    """Each benchmarked attempt gets a predicted-vs-measured chart; the verification table lists every output."""
    report = measured_run.report
    timed = [a for a in report["attempts"] if (a.get("benchmark") or {}).get("stage_times_s")]
    charts = measured_run.dom.find_all("figure", "times")
    assert len(charts) == len(timed) >= 1
    for figure, attempt in zip(charts, timed, strict=True):
        measured = [float(r.attrs["data-seconds"]) for r in figure.find_all("rect", "bar-measured")]
        predicted = [
            float(r.attrs["data-seconds"]) for r in figure.find_all("rect", "bar-predicted")
        ]
        assert measured == attempt["benchmark"]["stage_times_s"]
        assert predicted == attempt["predicted_stage_times_s"]
    section = measured_run.dom.find_all("section")
    verification = next(s for s in section if s.attrs.get("id") == "verification")
    assert report["verification"]["passed"] and "passed" in verification.one("h2").text()
    rows = verification.one("table").find_all("tr")[1:]
    assert [r.find_all("td")[0].text() for r in rows] == list(report["verification"]["outputs"])


def test_node_names_are_text_never_markup(measured_run: Run) -> None:
    """A node name holding <script> and & shows verbatim as text and creates no element."""
    dom = measured_run.dom
    assert dom.find_all("script") == [] and "<script" not in measured_run.html
    assert "data-pwned" not in dom.one("html").attrs
    first = measured_run.report["plan"]["stages"][0]["first_node"]
    assert first.startswith(HOSTILE)
    cells = [c.text() for c in dom.one("table", "stages").find_all("code")]
    assert first in cells
    strip_titles = [t.text() for t in dom.one("svg", "model-strip").find_all("title")]
    assert any(first in t for t in strip_titles)
    assert (
        measured_run.html.count(
            "&lt;script&gt;document.documentElement.dataset.pwned=&quot;1&quot;&lt;/script&gt; &amp; &lt;b&gt;"
        )
        > 0
    )


def test_warnings_name_the_renamed_nodes(measured_run: Run) -> None:
    """The unnamed node renamed by --name-nodes is listed under warnings."""
    warnings = next(
        s for s in measured_run.dom.find_all("section") if s.attrs.get("id") == "warnings"
    )
    items = [li.text() for li in warnings.find_all("li")]
    assert measured_run.report["model"]["renamed_nodes"] == 1
    assert any(i.startswith("renamed") and "1 unnamed or duplicate node" in i for i in items)


def test_failed_job_report_shows_the_error_and_every_attempt(
    ipu_model: Path, tmp_path: Path
) -> None:
    """When the compile budget ends with no split compiled, the page leads with the error and its hint
    and still shows the attempts. One out-of-memory compile proves nothing about the others: exit 5
    (not proven), never 3."""
    run = shard(
        tmp_path,
        ipu_model,
        IPU_CONFIG,
        5,
        "--backend",
        "poprt",
        "--max-attempts",
        "1",
        env=poprt_env(tmp_path, 10_000_000),
        expect=5,
    )
    error = next(s for s in run.dom.find_all("section") if s.attrs.get("id") == "error")
    assert (
        run.report["error"]["message"] in error.text()
        and run.report["error"]["hint"] in error.text()
    )
    assert run.dom.one("span", "status").text() == run.report["status"] == "not_proven"
    assert "(not proven)" in run.report["error"]["message"]
    assert run.report["verdict"]["proven"] is False
    assert run.dom.find_all("figure", "device") == []
    assert (
        len(run.dom.one("svg", "attempts-timeline").find_all("rect", "attempt"))
        == len(run.report["attempts"])
        == 1
    )


def decode_png(data: bytes) -> np.ndarray:
    """A PNG's RGB pixels, [height, width, 3]: 8-bit RGB/RGBA, all five row filters (what Chromium writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height, bpp = 8, [], 0, 0, 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and colour in (2, 6) and body[12] == 0, (
                "only 8-bit non-interlaced RGB(A)"
            )
            bpp = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat.append(body)
        pos += 12 + length
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), dtype=np.uint8).reshape(
        height, 1 + width * bpp
    )
    out = np.zeros((height, width * bpp), dtype=np.uint8)
    prev = np.zeros(width * bpp, dtype=np.int64)
    for y in range(height):
        kind, line = int(raw[y, 0]), raw[y, 1:].astype(np.int64)
        if kind == 0:
            cur = line
        elif kind == 1:
            cur = (np.cumsum(line.reshape(width, bpp), axis=0) & 255).reshape(-1)
        elif kind == 2:
            cur = (line + prev) & 255
        else:
            row, up = line.tolist(), prev.tolist()
            for x in range(len(row)):
                a = row[x - bpp] if x >= bpp else 0
                b, c = up[x], (up[x - bpp] if x >= bpp else 0)
                if kind == 3:
                    row[x] = (row[x] + (a + b) // 2) & 255
                else:
                    pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                    row[x] = (row[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
            cur = np.array(row, dtype=np.int64)
        out[y], prev = cur, cur
    return out.reshape(height, width, bpp)[:, :, :3]


def pixels_of(image: np.ndarray, colour: str) -> int:
    rgb = np.array([int(colour[k : k + 2], 16) for k in (1, 3, 5)], dtype=np.uint8)
    return int(np.count_nonzero(np.all(image == rgb, axis=2)))


def test_screenshot_shows_the_charts_in_colour(oom_run: Run, tmp_path: Path) -> None:
    """Chromium's screenshot of the page is a real picture: every stage colour, the OOM red and the
    success green cover visible areas."""
    png = tmp_path / "report.png"
    chromium(
        oom_run.out / "report.html",
        tmp_path / "profile",
        f"--screenshot={png}",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        "--hide-scrollbars",
    )
    data = png.read_bytes()
    assert len(data) > 50_000
    image = decode_png(data)
    assert image.shape == (WINDOW[1], WINDOW[0], 3)
    for colour in (
        "#4e79a7",
        "#f28e2b",
        "#59a14f",
        "#b07aa1",
        "#76b7b2",
    ):  # stages 0-4 (and memory parts)
        assert pixels_of(image, colour) > 2000, colour
    assert pixels_of(image, "#c62828") > 1000 and pixels_of(image, "#2e7d32") > 1000
    assert pixels_of(image, "#ffffff") < 0.95 * image.shape[0] * image.shape[1]
    if os.environ.get("SHARDERD_UPDATE_REPORT_PNG"):
        shutil.copyfile(png, REPO / "docs" / "report.png")
