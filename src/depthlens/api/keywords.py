"""The Python front's keywords. Every verb writes its settings out in its signature, typed, with their defaults —
generated from the config classes (``api.signatures``; tests/test_api_keywords.py fails when a config changes and
they were not generated again) —; ``verb`` routes each keyword the caller gave to the config class with a field
of its name (``Keywords``), refuses an unknown or mistyped one by name, records the call as a store's manifest
keeps it, and phrases every error about a setting as a Python caller reads it (``depthlens.generate(lens='x'):
…``; ``python_front``).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import inspect
import numbers
import sys
import types
import typing
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from depthlens.config import (
    AnswerConfig,
    DTRConfig,
    EngineConfig,
    LensSpec,
    OnlineConfig,
    ReadoutConfig,
    SamplingConfig,
    TaskSpec,
    TCBConfig,
    VotingConfig,
)
from depthlens.errors import ConfigError, DepthlensWarning, InputError, Said, did_you_mean, named, spelt

F = TypeVar("F", bound=Callable[..., Any])


@dataclasses.dataclass(frozen=True)
class Keywords:
    """A verb's settings: the fields of ``classes`` (the first class having a name wins), each a keyword of that
    name — but for ``prefix``, the verb's ℓ_prefix, which sets ``prefix_of`` (None: the verb writes its own
    ``prefix``) and takes that field's name as well. ``stored``: classes whose settings default to a stored pool's
    own (a keyword's None: the pool's); ``left_out``: fields the verb sets otherwise (its own keyword);
    ``own_prefix``: the field a verb's own ``prefix`` sets (its errors name ``prefix``)."""

    classes: tuple[type, ...]
    prefix_of: str | None = None
    stored: tuple[type, ...] = ()
    left_out: frozenset[str] = frozenset()
    own_prefix: str | None = None

    def fields(self) -> dict[str, tuple[type, str]]:
        """Keyword → (its class, its field), in signature order."""
        out: dict[str, tuple[type, str]] = {}
        for cls in self.classes:
            for f in dataclasses.fields(cls):
                key = "prefix" if f.name == self.prefix_of else f.name
                if f.name in ("name", *self.left_out) or f.name.startswith("_") or key in out:
                    continue
                out[key] = (cls, f.name)
        return out


POOL = (SamplingConfig, ReadoutConfig, DTRConfig, AnswerConfig, EngineConfig, TaskSpec)
VERBS: dict[str, Keywords] = {
    "score": Keywords((ReadoutConfig, DTRConfig, TCBConfig, EngineConfig), prefix_of="dtr_prefix_tokens"),
    "generate": Keywords(POOL, left_out=frozenset({"dtr_prefix_tokens"}), own_prefix="dtr_prefix_tokens"),
    "responses": Keywords(
        (DTRConfig,),
        stored=(DTRConfig,),
        left_out=frozenset({"dtr_prefix_tokens"}),
        own_prefix="dtr_prefix_tokens",
    ),
    "think_at_n": Keywords(
        (VotingConfig, DTRConfig),
        prefix_of="rank_prefix",
        stored=(DTRConfig,),
        left_out=frozenset({"n", "dtr_prefix_tokens"}),
    ),
    "online": Keywords((OnlineConfig, *POOL), prefix_of="decision_prefix"),
}
"""Each verb's settings, by the config classes they belong to (the source of its signature's settings)."""


@dataclasses.dataclass(frozen=True)
class Call:
    """One call of a verb: the settings its caller gave (by keyword), the keyword each setting was given by where
    the two differ (``prefix`` for ``rank_prefix``), and the call as its store's manifest records it."""

    verb: str
    given: dict[str, Any]
    spelling: dict[str, str]
    command: str

    def settings(self, *classes: type) -> list[dict[str, Any]]:
        """The settings given, split by config class (``VERBS``), each under its field's name; a stored pool's
        setting given as None (its own) is left out."""
        keywords = VERBS[self.verb]
        routes = keywords.fields()
        parts: dict[type, dict[str, Any]] = {c: {} for c in classes}
        for key, value in self.given.items():
            cls, field = routes[key]
            if cls in parts and not (value is None and cls in keywords.stored):
                parts[cls][field] = value
        return [parts[c] for c in classes]


_CALL: contextvars.ContextVar[Call | None] = contextvars.ContextVar("call", default=None)


def this_call() -> Call:
    """The call of the verb running now (``verb`` sets it)."""
    call = _CALL.get()
    if call is None:
        raise RuntimeError("this_call() outside a verb: call the verb through depthlens.<verb>")
    return call


def verb(fn: F) -> F:
    """A verb of the API, called as written: an unknown keyword is refused naming the close ones, one of the wrong
    type naming its type (a numpy number taken as the Python one), the keyword ``rank_prefix=`` (the field
    ``prefix=`` sets) taken as ``prefix=``; its settings routed (``this_call``), and every error about a setting
    phrased for Python (``python_front``)."""
    from depthlens.api.scratch import remove_abandoned
    from depthlens.models.threads import threads_kept

    name = fn.__name__
    keywords = VERBS[name]
    signature = inspect.signature(fn)
    routes = keywords.fields()
    hints: dict[str, Any] = {}

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        hints.update(hints or typing.get_type_hints(fn))
        kwargs, spelling = _aliased(name, kwargs, keywords)
        _refuse_unknown(name, kwargs, signature.parameters)
        kwargs = {k: _checked(name, k, v, hints[k], routes.get(k)) for k, v in kwargs.items()}
        given = {k: v for k, v in kwargs.items() if k in routes}
        token = _CALL.set(Call(name, given, spelling, _command(name, args, kwargs)))
        remove_abandoned()  # scratch stores of verbs killed outright (kill -9) do not pile up
        try:
            with python_front(name, spelling), threads_kept():  # the run's threads end with it
                return fn(*args, **kwargs)
        finally:
            _CALL.reset(token)

    return call  # type: ignore[return-value]  # functools.wraps keeps fn's own signature for inspect and help()


def _aliased(verb: str, kwargs: dict[str, Any], keywords: Keywords) -> tuple[dict[str, Any], dict[str, str]]:
    """``kwargs`` with ``prefix``'s field name (``rank_prefix=``) taken as ``prefix=``; the keyword each setting
    was given by (errors name it so)."""
    field = keywords.prefix_of or keywords.own_prefix
    if keywords.prefix_of is None or field not in kwargs:
        return kwargs, {field: "prefix"} if field else {}
    if "prefix" in kwargs:
        raise InputError(
            f"depthlens.{verb}(prefix=…, {field}=…): the same setting twice; give one", setting=field
        )
    return {("prefix" if k == field else k): v for k, v in kwargs.items()}, {}


def _refuse_unknown(verb: str, given: Iterable[str], known: Iterable[str]) -> None:
    """Refuse the first keyword of ``given`` that is not ``known``: the close spellings first (``progres`` →
    ``progress``), then every known name, so a typo never reads as a list to search."""
    known = sorted(set(known))
    for key in given:
        if key not in known:
            close = did_you_mean(key, known)
            listed = f" (known: {', '.join(known)})" if close else f"; known: {', '.join(known)}"
            raise InputError(f"depthlens.{verb}({key}=…): no such setting{close}{listed}", setting=key)


def _checked(verb: str, key: str, value: Any, hint: Any, route: tuple[type, str] | None) -> Any:
    """``value`` of the keyword ``key`` if it is of the type ``hint`` (a numpy number as the Python one), else
    refused naming the type and, for a setting, the config field it sets."""
    if (
        isinstance(value, numbers.Number)
        and not isinstance(value, (bool, int, float))
        and hasattr(value, "item")
    ):
        value = value.item()  # numpy's int64 / float32: stores and manifests take Python's
    if _fits(value, hint, literal=route is None):  # a config's own check names its choices
        return value
    where = f" ({route[0].__name__}.{route[1]})" if route else ""
    raise InputError(f"depthlens.{verb}({key}={value!r}): must be {_type_name(hint)}{where}", setting=key)


def _fits(value: Any, hint: Any, literal: bool = False) -> bool:
    """Whether ``value`` is of the type ``hint``; a Literal's choices only with ``literal`` (a setting's are its
    config's own check, with its message)."""
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return not literal or value in typing.get_args(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, h, literal) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is LensSpec:  # given as its text (``lens="jacobian:PATH"``), resolved once by ``resolve.readout``
        return isinstance(value, (str, LensSpec))
    if origin is tuple:
        return isinstance(value, (tuple, list))
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def _type_name(hint: Any) -> str:
    """A type as a message names it: ``float``, ``int or None``, ``bool or 'bars' or 'lines'``."""
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return " or ".join(repr(a) for a in typing.get_args(hint))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(h) for h in typing.get_args(hint))
    if hint is type(None):
        return "None"
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


def _command(verb: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
    """The call as a store's manifest records it (its provenance): the verb, what it ran on, the keywords given —
    ``depthlens.generate(<model 'smollm2-135m-instruct'>, 'reasoning_gym:chain_sum', pool=8, questions=8)``."""
    shown = [_shown(a) for a in args] + [f"{k}={_shown(v)}" for k, v in kwargs.items()]
    return f"depthlens.{verb}({', '.join(shown)})"


def _shown(value: Any) -> str:
    """A value as a call's record shows it: a model by its name, a collection by its size, others by repr."""
    if hasattr(value, "n_layers") and hasattr(value, "name"):
        return f"<model {value.name!r}>"
    if hasattr(value, "num_rows"):
        return f"<table of {value.num_rows} rows>"
    if isinstance(value, Path):
        return repr(str(value))
    if isinstance(value, (list, tuple)) and len(value) > 8:
        return f"<{len(value)} {'records' if all(isinstance(v, dict) for v in value) else 'items'}>"
    text = repr(value)
    return text if len(text) <= 120 else f"<{type(value).__name__}>"


@contextlib.contextmanager
def python_front(verb: str, spelling: Mapping[str, str] = {}) -> Iterator[None]:
    """Errors about a setting, as a Python caller reads them: ``depthlens.generate(lens='x'): …``, each setting
    by the keyword the caller gave (``prefix=`` for ``rank_prefix``), a setting set to a value as Python writes
    it (``n=3``, ``tokens=True``)."""
    try:
        yield
    except (ConfigError, InputError) as exc:
        if exc.setting is None or not exc.requirement or type(exc) not in (ConfigError, InputError):
            raise
        raise type(exc)(
            python_line(verb, exc, spelling),
            setting=exc.setting,
            value=exc.value,
            requirement=exc.requirement,
            owner=exc.owner,
        ) from None


def python_line(verb: str, said: Said, spelling: Mapping[str, str] = {}) -> str:
    """What an error or a warning says to a Python caller of ``verb``: a setting by the keyword the caller gave
    it by, set to a value as Python writes it (``n=3``)."""

    def keyword(setting: str) -> str:
        return spelling.get(setting, setting)

    def assign(setting: str, value: str) -> str:
        return f"{keyword(setting)}={value}"

    if said.setting is None or not said.requirement:
        return said.phrased(spell=keyword, assign=assign)
    own = keyword(said.setting)
    requirement = spelt(said.requirement.replace(named(said.setting), own), keyword, assign)
    return f"depthlens.{verb}({own}={said.value!r}): {requirement}"


def warn(said: Iterable[DepthlensWarning]) -> None:
    """Each warning of a run, as a Python caller reads it (``warnings.warn``, attributed to the caller's line)."""
    call = this_call()
    for w in said:
        warnings.warn(python_line(call.verb, w, call.spelling), DepthlensWarning, stacklevel=_callers_level())


def _callers_level() -> int:
    """``warnings.warn``'s stacklevel of the first frame outside depthlens: the caller's own line."""
    package = str(Path(__file__).resolve().parents[1])
    frame: types.FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and str(Path(frame.f_code.co_filename).resolve()).startswith(package):
        frame, level = frame.f_back, level + 1
    return level
