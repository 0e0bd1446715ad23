"""The resolver every front shares: a setting whose value is derived from another or from a stored pool, and the
refusals of what a stored pool cannot honour — for the command line, the Python API (``api``) and the server
(``serve``) alike. Each front only phrases what this module raises (``errors.DepthlensError.phrased``: ``--lens``
on the command line, ``lens=`` in Python, ``depthlens.lens`` in a request).

A setting travels: front (a flag, a keyword, a request field) → the run's builder (``studies.runs``, which calls
``readout``/``online_window``/… here) → the config classes (``config``: each checks its own range and names the
setting) → the run specs (``config.run``) → the studies.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from depthlens.config import DTRConfig, LensSpec, OnlineConfig, ReadoutConfig, VotingConfig
from depthlens.errors import InputError, named


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
    return ReadoutConfig(divergence=divergence, also=kinds, lens=spec, **rest)  # type: ignore[arg-type]  # kinds as given: ReadoutConfig checks each


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
            requirement=f"{where} was read out through {named('lens', stored_lens)}, and Think@n votes on what "
            f"it holds; leave out {named('lens')}, or generate a store with {named('lens', lens)}",
        )
    if divergence is not None:
        from depthlens.stores.samples import kinds_line, stored_kinds

        voted = stored_kinds(dict(manifest))[0]
        if divergence != voted:
            raise InputError(
                setting="divergence",
                value=divergence,
                requirement=f"{where} holds {kinds_line(dict(manifest))} divergences and votes on {voted}; leave "
                f"out {named('divergence')}, or generate a store with {named('divergence', divergence)}",
            )


def stored_dtr(manifest: Mapping[str, Any], given: Mapping[str, Any], where: str) -> DTRConfig:
    """The DTR settings of a vote over a stored pool: the pool's own (a new pool: the defaults), each overridden
    where ``given`` (None: not given); a pool must hold what its settling rule reads (``check_stored_settle``)."""
    base = DTRConfig.from_dict(manifest["dtr"]) if "dtr" in manifest else DTRConfig()
    dtr = dataclasses.replace(base, **{k: v for k, v in given.items() if v is not None})
    check_stored_settle(manifest, dtr, where)
    return dtr


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
