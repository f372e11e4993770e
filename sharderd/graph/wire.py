"""Protobuf's wire format as the model readers need it: varints, ``ModelProto``'s top-level fields,
and the errors for a file that is cut short or does not parse (one wording for every reader)."""

from __future__ import annotations

import json
import shlex

from sharderd.errors import ModelInvalidError

__all__ = [
    "MODEL_FIELDS",
    "check_command",
    "decode_varint",
    "encode_varint",
    "incomplete_error",
    "truncated_field",
    "unparsable_error",
]

MODEL_FIELDS: dict[int, tuple[str, int]] = {
    1: ("ir_version", 0),
    2: ("producer_name", 2),
    3: ("producer_version", 2),
    4: ("domain", 2),
    5: ("model_version", 0),
    6: ("doc_string", 2),
    7: ("graph", 2),
    8: ("opset_import", 2),
    14: ("metadata_props", 2),
    20: ("training_info", 2),
    25: ("functions", 2),
}
"""``ModelProto`` fields by number: name and wire type (0 varint, 2 length-delimited)."""


def check_command(where: str) -> str:
    """A shell command that shows onnx's own verdict on the file (exit 1 and the reason when bad).

    ``python -m onnx.checker`` is not one: that module has no ``__main__`` and exits 0 on any file.
    """
    code = f"import onnx; onnx.checker.check_model({json.dumps(where)})"
    return f"`python3 -c {shlex.quote(code)}`"


def incomplete_error(where: str, what: str, size: int) -> ModelInvalidError:
    """The file ends inside ``what`` (a field, a tensor's data): a cut copy."""
    return ModelInvalidError(
        f"{where} looks incomplete: the file ends inside {what} ({size} bytes read); an "
        "interrupted copy or download leaves exactly this",
        hint=f"Copy the file again, whole. onnx's checker shows the same: {check_command(where)}",
    )


def unparsable_error(where: str, cause: str) -> ModelInvalidError:
    return ModelInvalidError(
        f"{where} is not an ONNX model: the protobuf does not parse ({cause})",
        hint=f"onnx's checker shows the same: {check_command(where)}",
    )


def truncated_field(data: bytes) -> str | None:
    """The ``ModelProto`` field a prefix of a valid model ends in, else None.

    Walks the top-level wire format: every field before the last must be a ModelProto field with
    its own wire type, and the last must run past the end of the file (a length or a varint cut
    short). Random bytes fail the first test within a field or two; a truncated copy passes both.
    """
    pos, complete = 0, 0
    while pos < len(data):
        key, pos = decode_varint(data, pos)
        if key is None:
            return "field key" if complete else None
        field = MODEL_FIELDS.get(key >> 3)
        if field is None or field[1] != key & 7:
            return None
        if field[1] == 0:
            value, pos = decode_varint(data, pos)
            if value is None:
                return field[0] if complete else None
        else:
            length, pos = decode_varint(data, pos)
            if length is None or pos + length > len(data):
                return field[0] if complete else None
            pos += length
        complete += 1
    return None


def decode_varint(data: bytes, pos: int) -> tuple[int | None, int]:
    """Decode a protobuf varint at ``pos``: ``(value, next position)``, value None when cut short."""
    value = shift = 0
    while pos < len(data) and shift < 64:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    return None, pos


def encode_varint(value: int) -> bytes:
    """A non-negative ``value`` as protobuf writes it (the fewest bytes)."""
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
