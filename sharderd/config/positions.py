"""Where each table and key of a TOML document is defined, so a config error can name its line.

``tomllib`` gives values, not positions. This scanner reads a document ``tomllib`` has already
accepted and records the 1-based line of every table header (``[a.b]``, ``[[a]]``) and every key,
as its full path from the root: dotted keys (``a.b = 1``), quoted keys (``"x y" = 1``) and keys
inside inline tables (``dims = { seq = 128 }``) included. Strings (all four kinds, multi-line
ones too), comments and arrays spanning lines are skipped as TOML defines them, so text that only
looks like a key inside a value is never taken for one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

__all__ = ["key_lines", "line_of"]

_BARE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_ESCAPES = {"b": "\b", "t": "\t", "n": "\n", "f": "\f", "r": "\r", '"': '"', "\\": "\\"}


def line_of(text: str, path: Sequence[str]) -> int | None:
    """The line defining ``path``, or its longest defined prefix (a missing key: its table's header)."""
    lines = key_lines(text)
    for end in range(len(path), 0, -1):
        line = lines.get(tuple(path[:end]))
        if line is not None:
            return line
    return None


def key_lines(text: str) -> Mapping[tuple[str, ...], int]:
    """``{path: line}`` for every table and key of ``text`` (valid TOML).

    A table's line is its header's; a table only implied (``a`` of ``[a.b]`` or of ``a.b = 1``) has
    the line that first implies it.
    """
    return _Scanner(text).scan()


class _Scanner:
    __slots__ = ("explicit", "found", "line", "pos", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.line = 1
        self.found: dict[tuple[str, ...], int] = {}
        self.explicit: set[tuple[str, ...]] = set()

    def scan(self) -> dict[tuple[str, ...], int]:
        table: tuple[str, ...] = ()
        while True:
            self._skip_blank(newlines=True)
            if self.pos >= len(self.text):
                return self.found
            if self.text[self.pos] == "[":
                double = self.text.startswith("[[", self.pos)
                self.pos += 2 if double else 1
                table = self._key()
                self._record(table)
                self.pos += 2 if double else 1  # the closing bracket(s)
            else:
                self._key_value(table)

    def _key_value(self, table: tuple[str, ...]) -> None:
        path = (*table, *self._key())
        self._record(path)
        self._skip_blank()
        self.pos += 1  # "="
        self._value(path)

    def _key(self) -> tuple[str, ...]:
        parts: list[str] = []
        while True:
            self._skip_blank()
            parts.append(self._simple_key())
            self._skip_blank()
            if self._peek() != ".":
                return tuple(parts)
            self.pos += 1

    def _simple_key(self) -> str:
        char = self._peek()
        if char == '"':
            return self._basic_string()
        if char == "'":
            end = self.text.index("'", self.pos + 1)
            key, self.pos = self.text[self.pos + 1 : end], end + 1
            return key
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] in _BARE:
            self.pos += 1
        return self.text[start : self.pos]

    def _value(self, path: tuple[str, ...]) -> None:
        self._skip_blank()
        char = self._peek()
        if char in ('"', "'"):
            self._string()
        elif char == "[":  # an array may span lines, comments included
            self._items("]", lambda: self._value(path), newlines=True)
        elif char == "{":  # an inline table is one line
            self._items("}", lambda: self._key_value(path), newlines=False)
        else:  # a number, boolean or date: up to the next delimiter
            while self.pos < len(self.text) and self.text[self.pos] not in ",]}#\n":
                self.pos += 1

    def _items(self, close: str, item: Callable[[], None], *, newlines: bool) -> None:
        """From the opening bracket past ``close``: ``item`` reads each element."""
        self.pos += 1
        while True:
            self._skip_blank(newlines=newlines)
            char = self._peek()
            if char == close:
                self.pos += 1
                return
            if char == ",":
                self.pos += 1
            else:
                item()

    def _string(self) -> None:
        quote = self.text[self.pos]
        if self.text.startswith(quote * 3, self.pos):
            end = self.pos + 3
            while True:
                end = self.text.index(quote * 3, end)
                if quote == "'" or not _escaped(self.text, end):
                    break
                end += 1
            while self.text.startswith(quote, end + 3):  # up to two quotes may end the content
                end += 1
            self.line += self.text.count("\n", self.pos, end)
            self.pos = end + 3
        elif quote == '"':
            self._basic_string()
        else:
            self.pos = self.text.index("'", self.pos + 1) + 1

    def _basic_string(self) -> str:
        out: list[str] = []
        pos = self.pos + 1
        while self.text[pos] != '"':
            if self.text[pos] == "\\":
                code = self.text[pos + 1]
                if code in "uU":
                    width = 4 if code == "u" else 8
                    out.append(chr(int(self.text[pos + 2 : pos + 2 + width], 16)))
                    pos += 2 + width
                    continue
                out.append(_ESCAPES.get(code, code))
                pos += 2
                continue
            out.append(self.text[pos])
            pos += 1
        self.pos = pos + 1
        return "".join(out)

    def _skip_blank(self, *, newlines: bool = False) -> None:
        """Skip spaces, tabs and a comment; with ``newlines``, blank and comment lines too."""
        text = self.text
        while self.pos < len(text):
            char = text[self.pos]
            if char in " \t\r":
                self.pos += 1
            elif char == "#":
                end = text.find("\n", self.pos)
                self.pos = len(text) if end < 0 else end
            elif char == "\n" and newlines:
                self.pos += 1
                self.line += 1
            else:
                return

    def _peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def _record(self, path: tuple[str, ...]) -> None:
        """``path`` is defined here; the tables it implies (``a`` of ``[a.b]``) are, until defined."""
        if path not in self.explicit:
            self.explicit.add(path)
            self.found[path] = self.line
        for end in range(1, len(path)):
            self.found.setdefault(path[:end], self.line)


def _escaped(text: str, quote_at: int) -> bool:
    """Whether the quote at ``quote_at`` follows an odd run of backslashes."""
    run = 0
    while text[quote_at - 1 - run] == "\\":
        run += 1
    return run % 2 == 1
