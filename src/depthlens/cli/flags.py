"""The command line's spelling of a setting: the one table of setting ↔ flag, and an error phrased with it.

A library error names the setting it is about (``errors.DepthlensError.setting``: a config field's name); the
command line reads it as the flag that sets it — ``--rho 1.5: must be in (0, 1]`` —, Python callers as the keyword.
"""

from __future__ import annotations

from depthlens.errors import Said, named, plain, spelt

FLAGS: dict[tuple[str, str], str | None] = {
    ("ReadoutConfig", "also"): "--also-divergences",
    ("ReadoutConfig", "vocab_size"): None,
    ("ReadoutConfig", "early_exit"): None,
    ("TCBConfig", "power_iterations"): None,
    ("LensFitConfig", "ridge"): None,
    ("LensFitConfig", "checkpoint_every"): None,
    ("JacobianFitConfig", "max_tokens"): "--prompt-tokens",
    ("JacobianFitConfig", "heldout"): "--heldout-prompts",
    ("JacobianFitConfig", "dtype"): "--lens-dtype",
    ("JacobianFitConfig", "checkpoint_every"): None,
    ("TCBConfig", "exact"): "--tcb-exact",
    ("SamplingConfig", "confidence_top_k"): None,
    ("AnswerConfig", "fallback"): "--answer-fallback",
    ("CorrelationConfig", "permutations"): None,
    ("CorrelationConfig", "min_responses"): None,
    ("CorrelationConfig", "min_questions"): None,
    ("CorrelationConfig", "min_outcome"): None,
    ("OnlineConfig", "keep"): "--eta",
    ("OnlineConfig", "window"): "--deepconf-window",
    ("OnlineConfig", "threshold"): None,
    ("RayConfig", "address"): "--ray-address",
    ("RayConfig", "block"): "--block-rows",
    ("ServeConfig", "model_id"): "--served-model-name",
    ("ServeConfig", "max_sample_tokens"): None,
    ("ModelSpec", "final_norm"): "--final-norm-path",
    # ℓ_prefix, one flag for three settings: the command says which (score/generate/correlate, thinkn, --online)
    ("", "dtr_prefix_tokens"): "--prefix",
    ("", "rank_prefix"): "--prefix",
    ("", "decision_prefix"): "--prefix",
    # a Python function and arrays handed back: the verbs' own keywords, no flag (issue 58)
    ("", "layer_stats"): None,
    ("", "hidden_layers"): None,
}
"""The settings whose command-line flag is not ``--`` + the setting's name with dashes (None: no flag sets it, so
its errors read as Python's; owner ``""``: whichever config holds it); every other setting's flag is that one."""


def flag_for(owner: str | None, name: str) -> str | None:
    """The command-line flag that sets ``owner.name`` (None: set from Python or a manifest only)."""
    default = FLAGS.get(("", name), "--" + name.replace("_", "-"))
    return FLAGS.get((owner or "", name), default)


def flag_line(said: Said) -> str:
    """An error (or a warning) as a command-line user reads it: a setting's error names its flag (``--eta 1.5:
    must be in (0, 1]``), and so does every setting its text names (``errors.named``: ``--n 3``, ``--tokens``,
    ``--no-tcb``)."""

    def spell(setting: str) -> str:
        return flag_for(said.owner, setting) or setting

    def assign(setting: str, value: str) -> str:
        flag = spell(setting)
        if value in ("True", "False") and flag.startswith("--"):  # an on/off flag says its state by its name
            return flag if value == "True" else "--no-" + flag.removeprefix("--")
        return f"{flag} {plain(value)}"

    flag = flag_for(said.owner, said.setting) if said.setting is not None else None
    if flag is not None and flag.startswith("--") and said.requirement and isinstance(said.value, bool):
        head = assign(str(said.setting), str(said.value))  # an on/off flag's error: ``--layer-target: …``
        requirement = said.requirement.replace(named(str(said.setting)), flag)
        return f"{head}: {spelt(requirement, spell, assign)}"
    if flag is not None and said.requirement and isinstance(said.value, (list, tuple)):
        listed = ",".join(str(v) for v in said.value)  # as the flag takes a list: ``--track 3,5``
        requirement = said.requirement.replace(named(str(said.setting)), flag)
        return f"{flag} {listed}: {spelt(requirement, spell, assign)}"
    return said.phrased(flag, spell=spell, assign=assign)
