"""How an env's raw CSV rows become samples: the RowSchema an env declares, and the errors a bad row raises.

A schema lists the CSV columns a row needs, the tar extension of each image the row refers to (in the order
the env's prompt shows them), and a `parse` function that validates one row (a dict of strings) into a Row or
raises RowSkip with a reason. `RowSchema.row` adds the checks every env shares (an image name per image), so
`parse` checks only the env's own columns. The shard stage counts skips by reason in its manifest; they never
stop it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

SAFE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")  # webdataset splits names at dots: keys must have none


class RowSkip(Exception):
    """A raw row that cannot become a sample; `reason` is the manifest counter it adds to."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


@dataclass(frozen=True)
class Row:
    """A validated row: its sample key, the image file names it needs and its json metadata."""

    key: str
    images: tuple[str, ...]
    meta: dict


@dataclass(frozen=True)
class RowSchema:
    """How one env's raw CSV rows become samples."""

    name: str  # the env's name, written into the shard manifest
    required: tuple[str, ...]  # CSV columns every row needs
    image_exts: tuple[str, ...]  # tar extension of each image, in row order (e.g. "jpg" or "left.jpg")
    parse: Callable[[dict[str, str]], Row]  # validates one row; raises RowSkip for a bad one
    # Rows may have fewer images, down to this many (the first extensions, in order); 0: exactly one per extension.
    min_images: int = 0

    @property
    def image_count(self) -> int:
        """How many images every sample has: one per extension."""
        return len(self.image_exts)

    @property
    def image_roles(self) -> tuple[str, ...]:
        """What tells a sample's images apart, for messages: "left" of "left.jpg"; none for one plain "jpg"."""
        return tuple(ext.rpartition(".")[0] for ext in self.image_exts if "." in ext)

    def row(self, record: dict[str, str]) -> Row:
        """One CSV row (a dict of strings) as a Row: the env's `parse`, then a name for each of its images."""
        row = self.parse(record)
        if not all(row.images):
            roles = "/".join(self.image_roles)
            raise RowSkip("image_missing", f"empty {roles + ' ' if roles else ''}image name")
        return row
