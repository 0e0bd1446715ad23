"""One front door: plain settings become a run's specs here, for the command line, the Python API
(``studies.api``) and the server (``serve``) alike. Defaults, derived defaults and refusals live here once; each
front only phrases what this module raises (``errors.DepthlensError.phrased``: ``--lens`` on the command line,
``lens=`` in Python, ``depthlens.lens`` in a request).

A setting travels: front (a flag, a keyword, a request field) → ``settings``/``readout``/… here (checked,
defaulted) → the config classes (``config``: each checks its own range and names the setting) → the run specs
(``config.run``) → the studies.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import types
import typing
from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import Any

from depthlens.config import DTRConfig, LensSpec, OnlineConfig, ReadoutConfig, VotingConfig
from depthlens.config.readout import check_layer_top
from depthlens.errors import ConfigError, InputError, did_you_mean, named, spelt


def readout(
    divergence: str = ReadoutConfig.divergence,
    also: str | tuple[str, ...] = (),
    lens: str | LensSpec = "logit",
    **rest: Any,
) -> ReadoutConfig:
    """The readout of a run: ``also`` comma-separated (the command line's) or a tuple; a fitted ``lens``
    (``tuned:PATH``, ``jacobian:PATH``) resolved here, once — its form found, its stamp read, its fit's digest
    taken (``readout.lenses.resolve_lens``) — so the config every part of the run reads holds it as a value."""
    kinds = tuple(k.strip() for k in also.split(",") if k.strip()) if isinstance(also, str) else tuple(also)
    spec = LensSpec.parse(lens)  # the text checked before any file is read (a one-line error naming `lens`)
    if spec.path is not None:
        from depthlens.readout.lenses import resolve_lens  # torch: only where a fitted lens is read

        spec = resolve_lens(spec)
    return ReadoutConfig(divergence=divergence, also=kinds, lens=spec, **rest)  # type: ignore[arg-type]


def layer_top_k(k: int, tokens: bool) -> int:
    """K of each layer's top-k a front asks for alone (a server request: its readout is the server's): in
    ``ReadoutConfig.layer_top_k``'s range, and only with per-token values (``config.readout.check_layer_top``)."""
    ReadoutConfig(layer_top_k=k)  # the range, named as the setting
    check_layer_top(k, tokens)
    return k


def voting_n(n: int | None, available: int | None) -> tuple[int, bool]:
    """n of a vote: as given, else ``VotingConfig.n`` — or the stored pool's ``available`` responses per question
    where that is smaller. Returns n and whether it was lowered to the pool (a front says so)."""
    if n is not None:
        return n, False
    if available is not None and available < VotingConfig.n:
        return available, True
    return VotingConfig.n, False


def check_stored_readout(
    manifest: Mapping[str, Any], where: str, lens: str | None = None, divergence: str | None = None
) -> None:
    """A vote over a stored pool honours only what the pool holds: a ``lens`` other than the one it was read out
    through, or a ``divergence`` it was not generated with, is refused naming both."""
    stored_lens = str((manifest.get("readout") or {}).get("lens", ReadoutConfig.lens))
    if lens is not None and not LensSpec.parse(lens).same_folder(LensSpec.parse(stored_lens)):
        raise InputError(
            setting="lens",
            value=lens,
            requirement=f"{where} was read out through {named('lens')} {stored_lens}, and Think@n votes on what "
            f"it holds; leave out {named('lens')}, or generate a store with {named('lens')} {lens}",
        )
    if divergence is not None:
        from depthlens.stores.samples import kinds_line, stored_kinds

        voted = stored_kinds(dict(manifest))[0]
        if divergence != voted:
            raise InputError(
                setting="divergence",
                value=divergence,
                requirement=f"{where} holds {kinds_line(dict(manifest))} divergences and votes on {voted}; leave "
                f"out {named('divergence')}, or generate a store with {named('divergence')} {divergence}",
            )


def check_stored_settle(manifest: Mapping[str, Any], dtr: DTRConfig, where: str) -> None:
    """Voting over a stored pool under the top-K rule (``settle`` ``topk:K``) reads each layer's stored top-k ids:
    a pool that holds fewer than K per layer (``layer_top_k``) is refused naming both, before any is read."""
    k = dtr.top_k
    held = (manifest.get("readout") or {}).get("layer_top_k") or 0
    if k is not None and held < k:
        raise InputError(
            setting="settle",
            value=dtr.settle,
            requirement=f"the top-{k} rule settles from each layer's top {k} token ids, and {where} holds "
            + (f"{held} per layer" if held else "none")
            + f"; leave out {named('settle')} (the store's rule), or generate a store with {named('layer_top_k')} "
            f"{k}",
        )


def online_window(readout_tokens: int | None, given: bool, policy: OnlineConfig) -> int | None:
    """The read-out window of an online run: as given, else the policy's ℓ (no token past it decides)."""
    return readout_tokens if given else policy.decision_prefix


def online_policy(prefix: int | None, **settings: Any) -> OnlineConfig:
    """Online Think@n's policy from the ℓ_prefix a front was given (``--prefix N|full``); it decides at a finite
    ℓ, so a full-length ``prefix`` is refused."""
    if prefix is None:
        raise InputError(
            setting="decision_prefix",
            value="full",
            requirement="online Think@n decides on a finite ℓ; 'full' is an offline ablation",
        )
    return OnlineConfig(decision_prefix=prefix, **settings)


PREFIX_OF: dict[type, str] = {
    VotingConfig: "rank_prefix",
    OnlineConfig: "decision_prefix",
    DTRConfig: "dtr_prefix_tokens",
}
"""The setting a verb's ``prefix=`` keyword (ℓ_prefix, the command line's ``--prefix``) sets: that of the verb's
first config class holding one — ``think_at_n``: Think@n's ranking; ``online``: the policy's decision; ``score``:
the ``dtr_prefix`` score."""


# ---- keyword settings (the Python API's) ---------------------------------------------------------------------


def fields_of(*classes: type) -> dict[str, tuple[type, Any]]:
    """Every settable field of ``classes`` (the first class having a name wins): name → (class, its type)."""
    out: dict[str, tuple[type, Any]] = {}
    for cls in classes:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name != "name" and f.name not in out and not f.name.startswith("_"):
                out[f.name] = (cls, hints[f.name])
    return out


def _fits(value: Any, hint: Any) -> bool:
    """Whether ``value`` is of the type ``hint`` (Literal choices are the config's own check, with its message)."""
    origin = typing.get_origin(hint)
    if hint is Any or origin is typing.Literal:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is LensSpec:  # given as its text (``lens="jacobian:PATH"``), resolved by ``readout``
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


def split(verb: str, settings: Mapping[str, Any], *classes: type) -> list[dict[str, Any]]:
    """``settings`` split by config class (each keyword to the first of ``classes`` with a field of its name),
    each checked against its field's type; an unknown or mistyped keyword is refused naming the known ones.
    ``prefix`` is the verb's ℓ_prefix (``PREFIX_OF``), as on the command line."""
    known = fields_of(*classes)
    parts: dict[type, dict[str, Any]] = {c: {} for c in classes}
    prefix = next((PREFIX_OF[c] for c in classes if c in PREFIX_OF), None)
    if prefix is not None and "prefix" in settings:
        if prefix in settings:
            raise InputError(
                f"depthlens.{verb}(prefix=…, {prefix}=…): the same setting twice; give one", setting=prefix
            )
        _KEYWORDS.set({**(_KEYWORDS.get() or {}), prefix: "prefix"})  # its errors name the keyword given
    refuse_unknown(verb, settings, {*known, "prefix"} if prefix is not None else known)
    for given, value in settings.items():
        key = prefix if given == "prefix" and prefix is not None else given
        cls, hint = known[key]
        if not _fits(value, hint):
            raise InputError(
                f"depthlens.{verb}({given}={value!r}): must be {_type_name(hint)} ({cls.__name__}.{key})",
                setting=key,
            )
        parts[cls][key] = value
    return [parts[c] for c in classes]


def refuse_unknown(verb: str, given: Iterable[str], known: Iterable[str]) -> None:
    """Refuse the first keyword of ``given`` that is not ``known``: the close spellings first (``progres`` →
    ``progress``), then every known name, so a typo never reads as a list to search."""
    known = sorted(set(known))
    for key in given:
        if key not in known:
            close = did_you_mean(key, known)
            listed = f" (known: {', '.join(known)})" if close else f"; known: {', '.join(known)}"
            raise InputError(f"depthlens.{verb}({key}=…): no such setting{close}{listed}", setting=key)


def _type_name(hint: Any) -> str:
    return str(hint).replace("typing.", "").replace("<class '", "").replace("'>", "")


_KEYWORDS: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar("keywords", default=None)
"""A setting → the keyword a verb's caller gave it by, where that differs (``prefix`` for ``rank_prefix``)."""


@contextlib.contextmanager
def python_front(verb: str, flags: Collection[str] = ()) -> Iterator[None]:
    """Errors about a setting, as a Python caller reads them: ``depthlens.generate(lens='x'): …``, each setting
    by the keyword the caller gave (``prefix=`` for ``rank_prefix``); a setting of ``flags`` (the verb's on/off
    keywords, ``tokens``) named in the text reads as the call that sets it, ``tokens=True``."""
    given = _KEYWORDS.set(None)
    try:
        yield
    except (ConfigError, InputError) as exc:
        if exc.setting is None or not exc.requirement or type(exc) not in (ConfigError, InputError):
            raise
        keywords = _KEYWORDS.get() or {}

        def keyword(setting: str) -> str:
            return keywords.get(setting, setting)

        def called(setting: str) -> str:
            name = keyword(setting)
            return f"{name}=True" if name in flags else name

        message = f"depthlens.{verb}({keyword(exc.setting)}={exc.value!r}): " + spelt(exc.requirement, called)
        raise type(exc)(
            message, setting=exc.setting, value=exc.value, requirement=exc.requirement, owner=exc.owner
        ) from None
    finally:
        _KEYWORDS.reset(given)
