"""The verbs' settings as their signatures write them, generated from the config classes (``keywords.VERBS``): one
line per keyword — its field's annotation and default (a stored pool's settings: ``| None = None``, the pool's own).
The config classes stay the one source of truth; ``python -m depthlens.api.signatures`` writes the lines into each
verb's signature, and tests/test_api_keywords.py fails when a config field is added or changed without it.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import sys
from pathlib import Path

from depthlens.api.keywords import VERBS

MODULES = {
    "score": "depthlens.api.score",
    "generate": "depthlens.api.pools",
    "responses": "depthlens.api.pools",
    "online": "depthlens.api.pools",
    "think_at_n": "depthlens.api.votes",
}
"""Where each verb is written."""


def _literal(value: object) -> str:
    """A default as the formatter writes it (double-quoted strings)."""
    if isinstance(value, str) and '"' not in value and "\\" not in value:
        return f'"{value}"'
    return repr(value)


def settings_lines(verb: str) -> list[str]:
    """The lines of ``verb``'s signature that hold its settings, as they are to be written."""
    keywords = VERBS[verb]
    lines = []
    for key, (cls, name) in keywords.fields().items():
        field = next(f for f in dataclasses.fields(cls) if f.name == name)
        annotation = str(field.type)  # the class's own text: every config module postpones its annotations
        if cls in keywords.stored:
            default = "None"
            annotation = annotation if annotation.endswith("| None") else f"{annotation} | None"
        elif annotation == "LensSpec":  # given as its text (``lens="jacobian:PATH"``), resolved once
            annotation, default = "str | LensSpec", _literal(str(field.default))
        elif field.default is not dataclasses.MISSING:
            default = _literal(field.default)
        elif field.default_factory is not dataclasses.MISSING:
            default = _literal(field.default_factory())
        else:  # every config field has a default: a verb's keyword may be left out
            raise TypeError(f"{cls.__name__}.{name} has no default; a verb's keyword needs one")
        lines.append(f"    {key}: {annotation} = {default},")
    return lines


def written_lines(verb: str) -> tuple[Path, int, int, list[str]]:
    """Where ``verb``'s settings are written now: its file, the first and last line (1-based) of the keywords
    ``VERBS`` names, and those lines."""
    module = importlib.import_module(MODULES[verb])
    path = Path(inspect.getfile(module))
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == verb)
    names = set(VERBS[verb].fields())
    params = [a for a in fn.args.kwonlyargs if a.arg in names]
    first, last = params[0].lineno, params[-1].end_lineno or params[-1].lineno
    return path, first, last, text.splitlines()[first - 1 : last]


def write(verb: str) -> bool:
    """Write ``verb``'s settings lines into its signature; whether anything changed. The generated lines replace
    the run of keywords that stands there now, so they are to stay together, last in the signature."""
    path, first, last, now = written_lines(verb)
    wanted = settings_lines(verb)
    if now == wanted:
        return False
    lines = path.read_text(encoding="utf-8").splitlines()
    lines[first - 1 : last] = wanted
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return True


def main() -> None:
    """Write every verb's settings; says which changed (then run ``ruff format``)."""
    changed = [verb for verb in VERBS if write(verb)]
    print(f"settings written: {', '.join(changed) or 'none changed'}", file=sys.stderr)


if __name__ == "__main__":
    main()
