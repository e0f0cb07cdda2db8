"""Access to data shipped inside the wheel (``dstk/data`` and ``dstk.templates``)."""

from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable


def data_file(*parts: str) -> Traversable:
    """A file under ``toolkit/data`` (installed as ``dstk/data``)."""
    node = resources.files("dstk").joinpath("data")
    for part in parts:
        node = node.joinpath(part)
    return node


def template(*parts: str) -> Traversable:
    """A file under ``templates/`` (installed as ``dstk.templates``)."""
    node = resources.files("dstk.templates")
    for part in parts:
        node = node.joinpath(part)
    return node
