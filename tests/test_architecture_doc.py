"""docs/architecture.md stays true: every module under src/depthlens is named there, every room has its row and its
line in the diagram, and every module path the doc names exists — a module added, moved, renamed or deleted
without the doc fails here.

A module is named by its path (``stores/access.py``), its dotted name (``stores.samples``, also as the start of
``stores.samples.read_responses``), or in its room's row of the rooms table by file name (``hf.py`` in the
``sampling/`` row is ``sampling/hf.py``; ``engine.py`` there is ``sampling/vllm/engine.py``, as is
``vllm/engine.py``). Each of these is checked to exist, so a module is never named only by a bare word (``hf``):
that could not tell a deleted module from another name.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parent.parent
SRC = ROOT / "src" / "depthlens"
DOC = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
# every `ticked` or **bold** name of the doc, depthlens's own prefix dropped
MENTIONS = [
    re.sub(r"^(src/depthlens/|depthlens/|depthlens\.)", "", m)
    for m in re.findall(r"`([^`\n]+)`", DOC) + re.findall(r"\*\*([\w./]+)\*\*", DOC)
]


def _modules() -> list[str]:
    """Every module as its path under src/depthlens (``sampling/vllm/engine.py``), package ``__init__`` aside."""
    return sorted(p.relative_to(SRC).as_posix() for p in SRC.rglob("*.py") if p.name != "__init__.py")


def _rooms() -> list[str]:
    """The rooms: top-level packages (``config/``) and top-level modules (``errors.py``)."""
    return sorted(
        f"{p.name}/" if p.is_dir() else p.name
        for p in SRC.iterdir()
        if (p.is_dir() and (p / "__init__.py").is_file()) or (p.suffix == ".py" and p.name != "__init__.py")
    )


def _rows() -> dict[str, str]:
    """The rooms table: room (``config/``, ``errors.py``) → its concern cell (the key names are left out: a
    function may share a module's name)."""
    table = DOC.split("## The rooms", 1)[1].split("\n\n", 2)[1]
    rows = {}
    for line in table.splitlines()[2:]:  # after the header and its rule
        cells = line.strip().strip("|").split(" | ")
        room = re.fullmatch(r"\s*`([\w./]+)`\s*", cells[0])
        assert room and len(cells) >= 3, f"docs/architecture.md: a rooms-table row not read as one: {line!r}"
        rows[room.group(1)] = " | ".join(cells[1:-1])
    return rows


def _named(module: str, rows: dict[str, str]) -> bool:
    dotted = module.removesuffix(".py").replace("/", ".")
    if any(m in (module, dotted) or m.startswith(dotted + ".") for m in MENTIONS):
        return True
    head, _, inner = module.partition("/")  # inner: the path inside its room (vllm/engine.py)
    in_row = re.findall(r"`([^`]+)`", rows.get(f"{head}/", ""))
    name = module.rsplit("/", 1)[-1]
    return any(t in (name, inner) for t in in_row)


def _dotted_exists(room: str, name: str) -> bool:
    """``room.name``: a module or package of that room, or a name its package (or top-level module) defines."""
    package = SRC / room
    if (package / f"{name}.py").is_file() or (package / name / "__init__.py").is_file():
        return True
    own = package / "__init__.py" if package.is_dir() else SRC / f"{room}.py"
    return re.search(rf"\b{name}\b", own.read_text(encoding="utf-8")) is not None


def test_every_module_is_named_in_the_architecture_doc():
    rows = _rows()
    unnamed = [m for m in _modules() if not _named(m, rows)]
    assert not unnamed, (
        f"docs/architecture.md does not name {unnamed}; add each to its room's row of the rooms table "
        "(file name, or its path) or to the text"
    )


def test_every_room_has_a_row_and_a_line_in_the_diagram():
    rows, rooms = _rows(), _rooms()
    assert sorted(rows) == rooms, (
        f"docs/architecture.md: the rooms table has rows for {sorted(set(rows) - set(rooms))}, which are no rooms, "
        f"and none for {sorted(set(rooms) - set(rows))}"
    )
    words = set(re.findall(r"[a-z_]+", DOC.split("```", 2)[1]))  # the layer diagram
    missing = [r for r in rooms if r.removesuffix("/").removesuffix(".py") not in words]
    assert not missing, f"docs/architecture.md: the layer diagram leaves out {missing}"


def test_every_module_path_the_doc_names_exists():
    rows = _rows()
    rooms = {r.removesuffix("/").removesuffix(".py") for r in _rooms()}
    wrong = []
    for room, concern in rows.items():  # a file or folder name in a row: somewhere inside that room
        base = SRC / room
        inside = (
            [p.relative_to(base).as_posix() + "/" * p.is_dir() for p in base.rglob("*")]
            if base.is_dir()
            else []
        )
        for token in re.findall(r"`([\w./]+)`", concern):
            if token.split("/")[0] in rooms or not token.endswith((".py", "/")):
                continue  # a path from the package root (checked below), or no file name
            if not any(p == token or p.endswith(f"/{token}") for p in inside):
                wrong.append(f"{token} (in the {room} row)")
    for mention in MENTIONS:  # paths and dotted names anywhere, by their room
        parts = re.split(r"[./]", mention)
        if parts[0] not in rooms or len(parts) < 2 or not re.fullmatch(r"[\w./]+", mention):
            continue
        if "/" in mention:
            if not (SRC / mention).exists():
                wrong.append(mention)
        elif not mention.endswith(".py") and not _dotted_exists(parts[0], parts[1]):
            wrong.append(mention)  # (a bare file name such as readout.py is its row's: checked above)
    assert not wrong, f"docs/architecture.md names modules that do not exist: {sorted(set(wrong))}"
