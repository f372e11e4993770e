"""Unique node names: PopRT's Sharder and our annotations address nodes by name."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import onnx

__all__ = ["NameProblems", "assign_unique_names", "find_name_problems"]


@dataclass(frozen=True, slots=True)
class NameProblems:
    unnamed: tuple[int, ...]
    """Indices of top-level nodes with an empty name."""
    duplicates: tuple[str, ...]
    """Names used by more than one top-level node."""

    def __bool__(self) -> bool:
        return bool(self.unnamed or self.duplicates)

    def describe(self, graph: onnx.GraphProto, limit: int = 5) -> str:
        parts = []
        if self.unnamed:
            shown = ", ".join(
                f"#{i} ({graph.node[i].op_type} -> {', '.join(graph.node[i].output) or '-'})"
                for i in self.unnamed[:limit]
            )
            more = f" and {len(self.unnamed) - limit} more" if len(self.unnamed) > limit else ""
            parts.append(f"{len(self.unnamed)} node(s) have no name: {shown}{more}")
        if self.duplicates:
            shown = ", ".join(repr(n) for n in self.duplicates[:limit])
            more = (
                f" and {len(self.duplicates) - limit} more" if len(self.duplicates) > limit else ""
            )
            parts.append(f"{len(self.duplicates)} name(s) are used by several nodes: {shown}{more}")
        return "; ".join(parts)


def find_name_problems(graph: onnx.GraphProto) -> NameProblems:
    counts = Counter(node.name for node in graph.node if node.name)
    unnamed = tuple(i for i, node in enumerate(graph.node) if not node.name)
    duplicates = tuple(name for name, count in counts.items() if count > 1)
    return NameProblems(unnamed, duplicates)


def assign_unique_names(graph: onnx.GraphProto) -> int:
    """Name every unnamed node and the later twins of duplicates ``<OpType>_<k>``; returns how many.

    The first node keeps a duplicated name; new names never clash with any existing name.
    """
    taken = {node.name for node in graph.node if node.name}
    seen: set[str] = set()
    next_k: Counter[str] = Counter()
    renamed = 0
    for node in graph.node:
        if node.name and node.name not in seen:
            seen.add(node.name)
            continue
        op = node.op_type or "Node"
        while f"{op}_{next_k[op]}" in taken:
            next_k[op] += 1
        node.name = f"{op}_{next_k[op]}"
        taken.add(node.name)
        seen.add(node.name)
        renamed += 1
    return renamed
