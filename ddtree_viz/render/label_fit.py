"""Which labels of a figure fit: boxes in px, placed greedily in order of priority, each label kept only where it
touches no label kept before it and no marker but its own (issue #65: a dense tree's node labels ran into each
other). Pure geometry, no plotting: a renderer estimates the boxes (figure.text_px) and draws the labels kept.

Boxes are (left, top, right, bottom) in px, y growing downward, as a browser lays a figure out."""

from __future__ import annotations

from collections.abc import Hashable, Iterable

Box = tuple[float, float, float, float]
CELL_PX = 48.0  # the side of a cell of the index (a box is filed under every cell it touches)


def overlap(a: Box, b: Box, gap: float = 0.0) -> bool:
    """Whether two boxes come closer than `gap` px (0: whether they overlap at all)."""
    return a[0] < b[2] + gap and b[0] < a[2] + gap and a[1] < b[3] + gap and b[1] < a[3] + gap


class Boxes:
    """Boxes filed by the cells of a grid they touch, each with its owner: `clear` asks only the cells a box touches
    (a tree of 513 nodes asks each label against a handful of boxes, not all of them)."""

    def __init__(self, cell: float = CELL_PX):
        self.cell = cell
        self._cells: dict[tuple[int, int], list[tuple[Box, Hashable]]] = {}

    def _keys(self, box: Box):
        c = self.cell
        for i in range(int(box[0] // c), int(box[2] // c) + 1):
            for j in range(int(box[1] // c), int(box[3] // c) + 1):
                yield i, j

    def add(self, box: Box, owner: Hashable = None) -> None:
        for key in self._keys(box):
            self._cells.setdefault(key, []).append((box, owner))

    def clear(self, box: Box, owner: Hashable = None, gap: float = 0.0) -> bool:
        """No box filed comes within `gap` px of `box`, those of `owner` apart (None: none apart)."""
        for key in self._keys((box[0] - gap, box[1] - gap, box[2] + gap, box[3] + gap)):
            for other, whose in self._cells.get(key, ()):
                if (owner is None or whose != owner) and overlap(box, other, gap):
                    return False
        return True


def fitting(labels: Iterable[tuple[Hashable, Box]], markers: Iterable[tuple[Hashable, Box]], area: Box,
            gap: float = 2.0) -> set:
    """The owners of the labels that fit, taken in the order given (the most wanted first): a label fits inside
    `area`, `gap` px clear of every label kept before it, and clear of every marker but its owner's."""
    placed, nodes = Boxes(), Boxes()
    for owner, box in markers:
        nodes.add(box, owner)
    kept = set()
    for owner, box in labels:
        inside = area[0] <= box[0] and box[2] <= area[2] and area[1] <= box[1] and box[3] <= area[3]
        if inside and nodes.clear(box, owner) and placed.clear(box, None, gap):
            placed.add(box, owner)
            kept.add(owner)
    return kept
