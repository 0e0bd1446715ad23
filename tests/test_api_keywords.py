"""The Python verbs' keywords are written out in their signatures — typed, with defaults an editor and a type
checker see — and generated from the config classes (``api.signatures``), which stay the one source of truth: a
config field added or changed without writing the signatures again fails here, naming the command that does."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import sys
import typing

import pytest

import depthlens
from depthlens.api import signatures
from depthlens.api.keywords import VERBS
from depthlens.config import LensSpec, SamplingConfig


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_each_verbs_settings_are_written_as_the_configs_say(verb):
    _, first, last, written = signatures.written_lines(verb)
    assert written == signatures.settings_lines(verb), (
        f"{verb}'s settings (lines {first}–{last}) are not the configs' fields: run "
        "`python -m depthlens.api.signatures && ruff format src/depthlens/api`"
    )


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_a_type_checker_reads_each_keyword_as_its_field(verb):
    """The annotation a checker reads is the field's type (``| None`` where None means the stored pool's own);
    the default the signature shows is the field's own."""
    keywords = VERBS[verb]
    hints = typing.get_type_hints(getattr(depthlens, verb))
    params = inspect.signature(getattr(depthlens, verb)).parameters
    for key, (cls, name) in keywords.fields().items():
        field = typing.get_type_hints(cls)[name]
        if cls in keywords.stored:
            assert hints[key] == field | None and params[key].default is None, (verb, key)
            continue
        default = next(f for f in dataclasses.fields(cls) if f.name == name).default
        if field is LensSpec:  # a lens is given as its text too (``lens="jacobian:PATH"``), resolved once
            field = str | LensSpec
        assert hints[key] == field and params[key].default == default, (verb, key)


def test_a_field_added_to_a_config_fails_until_the_signatures_are_written(monkeypatch, tmp_path):
    """A new ``SamplingConfig`` field: the test above fails for ``generate``; the generator writes it in, and the
    verb's signature then holds it."""

    @dataclasses.dataclass(frozen=True)
    class Sampling(SamplingConfig):
        repetition_penalty: float = 1.0

    module = tmp_path / "verbs_under_test.py"
    source = inspect.getsource(importlib.import_module(signatures.MODULES["generate"]))
    module.write_text(source, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(signatures.MODULES, "generate", "verbs_under_test")
    keywords = VERBS["generate"]
    classes = tuple(Sampling if c is SamplingConfig else c for c in keywords.classes)
    monkeypatch.setitem(VERBS, "generate", dataclasses.replace(keywords, classes=classes))
    assert signatures.written_lines("generate")[3] != signatures.settings_lines("generate")
    assert signatures.write("generate") and not signatures.write("generate")  # written once, then as wanted
    sys.modules.pop("verbs_under_test", None)
    written = importlib.import_module("verbs_under_test").generate
    assert inspect.signature(written).parameters["repetition_penalty"].default == 1.0
    sys.modules.pop("verbs_under_test", None)


def test_the_package_offers_its_verbs_to_completion_and_imports_none_of_them():
    import subprocess

    names = set(dir(depthlens))
    assert {
        "score",
        "generate",
        "responses",
        "think_at_n",
        "online",
        "to_pandas",
        "from_pandas",
        "notes",
    } <= names
    assert not {"importlib", "Any", "annotations"} & names  # the module's own imports are not offered
    code = "import sys, depthlens; dir(depthlens); print(sorted(m for m in sys.modules if m.startswith('depthlens.')))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"  # `import depthlens` (and its completion) stays instant
