"""parse_compile_error: every PopRT/Poplar/PopART failure text it must recognise.

Texts are the forms quoted in poprt-facts.md §1-§2 (Poplar OOM texts, PopART validation).
"""

from __future__ import annotations

import pytest

from sharderd.backends.poprt_errors import parse_compile_error
from sharderd.backends.protocol import OomInfo

MK2 = 1472
MK1 = 1216
TILE_TEXT = "Out of memory on tile {t}: {u} bytes used but tiles only have 638976 bytes of memory"


class TestTileForm:
    def test_global_tile_maps_to_device_on_mk2(self) -> None:
        """Tile 1500 of a 1472-tile IPU is on IPU 1; bytes are the total used, capacity as printed."""
        outcome, oom, message = parse_compile_error(TILE_TEXT.format(t=1500, u=674752), MK2)
        assert outcome == "oom"
        assert oom == OomInfo("tile", device=1, tile=1500, bytes_used=674752, tile_bytes=638976)
        assert "device 1" in message and "674752" in message

    def test_global_tile_maps_to_device_on_mk1(self) -> None:
        """With 1216 tiles per IPU, tile 2500 is on IPU 2 (it would be IPU 1 with 1472)."""
        _, oom, _ = parse_compile_error(TILE_TEXT.format(t=2500, u=700000), MK1)
        assert oom is not None and (oom.device, oom.tile) == (2, 2500)
        _, oom_mk2, _ = parse_compile_error(TILE_TEXT.format(t=2500, u=700000), MK2)
        assert oom_mk2 is not None and oom_mk2.device == 1

    def test_last_tile_of_an_ipu_stays_on_it(self) -> None:
        """Tile 1471 is the last tile of IPU 0, tile 1472 the first of IPU 1."""
        assert parse_compile_error(TILE_TEXT.format(t=1471, u=1), MK2)[1].device == 0  # type: ignore[union-attr]
        assert parse_compile_error(TILE_TEXT.format(t=1472, u=1), MK2)[1].device == 1  # type: ignore[union-attr]

    def test_popart_prefix_is_searched_through(self) -> None:
        """PopART's log prefix "Memory allocation error : " does not hide the tile form."""
        text = "Memory allocation error : " + TILE_TEXT.format(t=0, u=876476)
        outcome, oom, _ = parse_compile_error(text, MK2)
        assert outcome == "oom"
        assert oom == OomInfo("tile", device=0, tile=0, bytes_used=876476, tile_bytes=638976)

    def test_multi_line_text_with_several_oom_forms_takes_first_tile_form(self) -> None:
        """A code-memory line before two tile lines loses to the first tile line."""
        text = "\n".join(
            [
                "[poplar] compiling...",
                "tile 5 _poplar_start must be 0 not 638976 bytes from the start of memory.",
                "Memory allocation error : " + TILE_TEXT.format(t=3000, u=700001),
                TILE_TEXT.format(t=10, u=800000),
            ]
        )
        _, oom, _ = parse_compile_error(text, MK2)
        assert oom == OomInfo("tile", device=2, tile=3000, bytes_used=700001, tile_bytes=638976)

    def test_unknown_tile_count_leaves_device_unknown(self) -> None:
        """tiles_per_device 0 keeps the tile but cannot name a device."""
        _, oom, message = parse_compile_error(TILE_TEXT.format(t=1500, u=674752), 0)
        assert oom is not None and oom.device is None and oom.tile == 1500
        assert "device" not in message

    def test_graphcore_short_form_without_capacity(self) -> None:
        """The tool's "[Failed] Out of memory on tile N: M bytes" echo still parses, capacity unknown."""
        _, oom, _ = parse_compile_error("[Failed] Out of memory on tile 2945: 650000 bytes", MK2)
        assert oom == OomInfo("tile", device=2, tile=2945, bytes_used=650000, tile_bytes=None)


class TestOtherMemoryForms:
    def test_variables_form_without_numbers(self) -> None:
        """The allowOutOfMemory form names no tile, so nothing is placed; the profile path is kept."""
        text = (
            "Out of memory: Cannot fit all variable data onto one or more tiles. "
            "Profile saved to: /tmp/report/profile.pop"
        )
        outcome, oom, message = parse_compile_error(text, MK2)
        assert outcome == "oom"
        assert oom == OomInfo("variables")
        assert "/tmp/report/profile.pop" in message

    def test_variables_form_without_profile(self) -> None:
        """The numberless form without a profile path is still out of memory."""
        outcome, oom, _ = parse_compile_error(
            "Out of memory: Cannot fit all variable data onto one or more tiles.", MK2
        )
        assert (outcome, oom) == ("oom", OomInfo("variables"))

    def test_code_memory_form(self) -> None:
        """Too much code names a tile, hence a device."""
        text = (
            "tile 3000 _poplar_start must be 0 not 638976 bytes from the start of memory. "
            "Typically this error occurs when there is too much code to fit in code memory."
        )
        outcome, oom, message = parse_compile_error(text, MK2)
        assert outcome == "oom"
        assert oom == OomInfo("code", device=2, tile=3000)
        assert "code" in message

    def test_exchange_form(self) -> None:
        """An exchange too large for a tile names the tile and the exchange."""
        text = "Tile 1473 receives more data than it has total memory in exchange 'IpuCopy/ipu1'"
        outcome, oom, message = parse_compile_error(text, MK2)
        assert outcome == "oom"
        assert oom == OomInfo("exchange", device=1, tile=1473)
        assert "IpuCopy/ipu1" in message

    def test_stream_form(self) -> None:
        """A host stream buffer that does not fit has no tile."""
        outcome, oom, message = parse_compile_error(
            "Out of memory. Single stream of length 1048576 in bufferIndex 3", MK2
        )
        assert (outcome, oom) == ("oom", OomInfo("stream"))
        assert "1048576" in message


VALIDATION_TEXTS = [
    (
        "Either all Ops must have their virtual graph ids set, or none must. Op count per virtual graph id\n"
        "  -1 : 1\n  0 : 3\nOps with no virtual graph id :  \n  Op(Relu_7 (ai.onnx.Relu:17), outputs=[r7])\n",
        "mixed annotation",
    ),
    (
        "Either all Ops in the main graph must have their virtual graph ids set, or none must. "
        "Op count per virtual graph id\n  -1 : 1\n",
        "mixed annotation",
    ),
    (
        "SessionOptions flag virtualGraphMode is VirtualGraphMode::Manual, but no Ops have been annotated "
        "with virtual graph information. This is an inconsistent combination.",
        "no node has an __ipu_number",
    ),
    (
        "Op(MatMul_3 (ai.onnx.MatMul:17), outputs=[m3]) has been assigned to an invalid virtual graph 4. numIPUs = 2.",
        "node MatMul_3 is on IPU 4, outside 0..1",
    ),
    (
        "If virtual graphs are disabled, the replicated graph count (1) needs to be equal to the number of IPUs (4)",
        "needs virtual_graph_mode 'manual'",
    ),
    (
        "Pipelining requires more than 1 IPU (currently 1) and the 'virtualGraphMode' session option to not "
        "be VirtualGraphMode::Off (currently VirtualGraphMode::Manual).",
        "pipelining needs more than one IPU",
    ),
    (
        "Ops [Op(a (ai.onnx.Add:17), outputs=[a]), Op(b (ai.onnx.Add:17), outputs=[b])] have the same "
        "pipeline stage 1, but different virtual graph ids {0, 1}. All ops with the same pipeline stage "
        "must also have the same virtual graph id",
        "pipeline stage 1 spans IPUs {0, 1}",
    ),
    (
        "The set of pipeline stages for all Ops contains 3 stages, but stage 1 is missing",
        "stage 1 is missing",
    ),
    ("Op has bad pipeline stage -2", "negative pipeline stage -2"),
    (
        "For pipelining, depth (batchesPerStep) must equal at least the number of pipeline stages (4)",
        "batches_per_step must be at least the number of pipeline stages (4)",
    ),
    (
        "For pipelining, depth (batchesPerStep) must be at least 4 for 4 IPUs",
        "batches_per_step must be at least 4",
    ),
    (
        "For pipelining, stream tensors can only be streamed directly onto a single IPU",
        "graph input is consumed on several IPUs",
    ),
    (
        "20 is an invalid number of IO tiles. Number of IO tiles must be an even number and >= 32.",
        "num_io_tiles = 20 is invalid",
    ),
    ("availableMemoryProportion must be in (0,1]", "available_memory_proportion must be in (0, 1]"),
    (
        "Only some ops have had their pipeline stage set. Ops missing the pipeline stage:\n  Op(Relu_1 (ai.onnx.Relu:17), outputs=[r1])",
        "Relu_1",
    ),
]


class TestValidation:
    @pytest.mark.parametrize(("text", "summary"), VALIDATION_TEXTS)
    def test_popart_validation_is_invalid_with_summary(self, text: str, summary: str) -> None:
        """Each PopART validation text is ``invalid`` with a summary that names the rule."""
        outcome, oom, message = parse_compile_error("popart_exception: " + text, MK2)
        assert (outcome, oom) == ("invalid", None)
        assert summary in message
        assert "\n" not in message

    def test_mixed_annotation_names_unannotated_nodes(self) -> None:
        """The summary lists the nodes that lack __ipu_number, at most five and a count."""
        names = [f"Relu_{k}" for k in range(8)]
        text = (
            "Either all Ops must have their virtual graph ids set, or none must. Op count per virtual graph id\n"
            "  -1 : 8\n  0 : 2\nOps with no virtual graph id :  \n"
            + "".join(f"  {n}\n" for n in names)
        )
        _, _, message = parse_compile_error(text, MK2)
        assert "Relu_0, Relu_1, Relu_2, Relu_3, Relu_4" in message
        assert "Relu_5" not in message and "3 more" in message

    def test_unknown_text_is_invalid_with_the_text(self) -> None:
        """An unrecognised failure is not memory: ``invalid`` carrying the compiler's words."""
        text = "poplar_error: Failed to compile the graph: internal compiler error"
        assert parse_compile_error(text, MK2) == ("invalid", None, text)

    def test_empty_text_gets_a_message(self) -> None:
        """An empty exception text still produces a readable message."""
        assert parse_compile_error("  ", MK2) == (
            "invalid",
            None,
            "compile failed without a message",
        )

    def test_oom_wins_over_validation_text_in_the_same_log(self) -> None:
        """A tile OOM in a long log is memory even when a validation phrase also appears."""
        text = "warning: Op has bad pipeline stage -1 (ignored)\n" + TILE_TEXT.format(t=1, u=674752)
        assert parse_compile_error(text, MK2)[0] == "oom"
