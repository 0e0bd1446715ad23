"""The explorer's spelling of a setting: the names of its query (``prefix``, ``eta``), as the command line spells
them as flags and the server as request fields (``errors.DepthlensError.phrased``)."""

from __future__ import annotations

from depthlens.errors import DepthlensError

QUERY_NAMES = {"rank_prefix": "prefix"}
"""A setting → the query parameter that sets it, where the names differ (every other one is its setting's name)."""


def query_name(setting: str) -> str:
    """The query parameter for ``setting``."""
    return QUERY_NAMES.get(setting, setting)


def said(exc: DepthlensError) -> str:
    """``exc`` as the explorer's reader reads it: a setting named by its query parameter (``eta=1.5: …``), never
    by a Python field."""
    if exc.setting is None or not exc.requirement:
        return exc.phrased(spell=query_name)
    return exc.phrased(f"{query_name(exc.setting)}=", spell=query_name)
