"""The Token Constraint Bound paper's four studies (definitions.md §6), each returning rows and a summary.

- ``regimes``: δ vs √V_eff and vs the top-2 margin at the next-token position of two prompt sets;
- ``geometry``: δ with the output distribution fixed while the competing tokens' unembedding rows cluster or
  disperse, over every position of the prompts, by V_eff band;
- ``prompt_variants``: accuracy, perplexity and mean δ of greedy answers per prompt template × number of shots;
- ``generation_trace``: δ and perplexity per generated token, with sharp drops flagged.
Figures and tables are drawn from these rows by ``viz.tcb`` and the CLI; nothing here writes files.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any

import torch

from depthlens.config import EngineConfig, ReadoutConfig, SamplingConfig, TCBConfig, TCBStudies
from depthlens.errors import InputError
from depthlens.evals.grading import grade
from depthlens.evals.loading import load_task
from depthlens.evals.tasks import MATH_INSTRUCTION, Question
from depthlens.metrics.tcb import Unembedding, token_constraint_terms
from depthlens.metrics.tcb_geometry import geometry_ablation, sharp_drops, v_eff_band
from depthlens.models.load import LoadedModel
from depthlens.readout.stream import lens_for
from depthlens.sampling.backend import GenerationBackend
from depthlens.sampling.choose import make_backend
from depthlens.stats.correlation import pearson, spearman
from depthlens.studies.score import score
from depthlens.studies.score_inputs import as_token_ids

Units = dict[str, Any]
"""A study's finished units (a prompt, a question × template × shots, the trace) by key, each its rows.

Every study takes the units an interrupted run finished (``done``, read back from its progress file) and calls
``on_unit(key, rows)`` as each new one finishes, so the CLI can persist it; the summary is always computed from
the rows, so a resumed run's result equals an uninterrupted one's.
"""
OnUnit = Callable[[str, Any], None]


def _ignore(_key: str, _rows: Any) -> None:
    """The default ``on_unit``: nothing is persisted."""


@dataclasses.dataclass
class StudyRun:
    """How a study runs: the units an interrupted run finished (``done``, by key; filled in as units finish), the
    callback that persists each new one, the engine that generates (``prompt_variants``, ``generation_trace``)
    and the seed of the questions (``prompt_variants``)."""

    done: Units = dataclasses.field(default_factory=dict)
    on_unit: OnUnit = _ignore
    engine: EngineConfig = dataclasses.field(default_factory=EngineConfig)
    seed: int = 0


def prompt_set(name: str) -> list[dict[str, Any]]:
    """A shipped prompt set (``diverse`` or ``low_veff``; see data/tcb/README.md) as id/category/prompt rows."""
    files = {"diverse": "diverse.jsonl", "low_veff": "low_veff.jsonl"}
    if name not in files:
        raise InputError(f"unknown prompt set {name!r}; shipped sets: {', '.join(files)}")
    text = resources.files("depthlens").joinpath("data", "tcb", files[name]).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


TEXT = "the TCB studies' work on text"


def _encode(lm: LoadedModel, prompt: str) -> list[int]:
    ids = as_token_ids(lm.text_tokenizer(TEXT)(prompt, add_special_tokens=True)["input_ids"])
    if not ids:
        raise InputError(f"prompt {prompt!r} tokenises to nothing")
    return ids


@torch.inference_mode()
def final_states(lm: LoadedModel, ids: Sequence[int]) -> torch.Tensor:
    """norm(h_L) at every position of ``ids``, [T, d] — the states whose next-token distribution TCB bounds."""
    out = lm.model(input_ids=torch.tensor([list(ids)], device=lm.device), output_hidden_states=True)
    last = out.hidden_states[-1][0]
    lens = lens_for(lm, ReadoutConfig())
    return last if lm.parts.last_hidden_normed else lens.normed(last)


def _unembedding(lm: LoadedModel) -> tuple[Unembedding, torch.Tensor]:
    unembed = Unembedding.from_lens(lens_for(lm, ReadoutConfig()))
    return unembed, unembed.row_norms_sq()


def _regime_summary(
    name: str, tcb: torch.Tensor, v_eff: torch.Tensor, margin: torch.Tensor
) -> dict[str, Any]:
    return {
        "set": name,
        "prompts": int(tcb.numel()),
        "median_v_eff": float(v_eff.median()) if tcb.numel() else None,
        "corr_tcb_sqrt_v_eff": pearson(tcb, v_eff.sqrt()),
        "corr_tcb_margin": pearson(tcb, margin),
        "spearman_tcb_v_eff": spearman(tcb, v_eff),
        "spearman_tcb_margin": spearman(tcb, margin),
    }


def regimes(
    lm: LoadedModel,
    sets: dict[str, list[dict[str, Any]]],
    tcb: TCBConfig = TCBConfig(),
    split: float = TCBStudies.split,
    run: StudyRun | None = None,
) -> dict:
    """Per prompt: δ, V_eff, margin at the next-token position; per set: corr(δ, √V_eff), corr(δ, margin).

    Beside the two prompt sets, all prompts pooled and split by their *measured* V_eff at ``split``: which
    regime a prompt is in is a property of the model's output there, not of how the prompt was chosen.
    Units (see ``Units``): one prompt, ``<set>/<id>``.
    """
    run = run or StudyRun()
    done, on_unit = run.done, run.on_unit
    unembed, norms = _unembedding(lm)
    rows, summary = [], []
    for set_name, prompts in sets.items():
        mine = []
        for p in prompts:
            key = f"{set_name}/{p['id']}"
            if key not in done:
                state = final_states(lm, _encode(lm, p["prompt"]))[-1:]
                terms = token_constraint_terms(unembed, state, norms, tcb.epsilon)
                done[key] = [
                    {
                        "set": set_name,
                        "id": p["id"],
                        "category": p.get("category"),
                        "prompt": p["prompt"],
                        "tcb": float(terms["tcb"][0]),
                        "v_eff": float(terms["v_eff"][0]),
                        "margin": float(terms["margin"][0]),
                    }
                ]
                on_unit(key, done[key])
            mine += done[key]
        rows += mine
        summary.append(_regime_summary(set_name, *_columns(mine)))
    columns = _columns(rows)
    for name, keep in (
        (f"V_eff ≥ {split:g}", columns[1] >= split),
        (f"V_eff < {split:g}", columns[1] < split),
    ):
        summary.append(_regime_summary(name, *(c[keep] for c in columns)))
    return {"rows": rows, "summary": summary}


def _columns(rows: Sequence[dict[str, Any]]) -> tuple[torch.Tensor, ...]:
    return tuple(torch.tensor([r[k] for r in rows], dtype=torch.float64) for k in ("tcb", "v_eff", "margin"))


_GEOMETRY_CHUNK = 128  # positions per float64 pass: [128, V] float64 tensors (150 MB at V = 152k)


def _geometry_rows(
    lm: LoadedModel,
    unembed: Unembedding,
    norms: torch.Tensor,
    p_index: int,
    prompt: str,
    top_k: int,
    cluster: float,
    disperse: float,
) -> list[dict[str, Any]]:
    states = final_states(lm, _encode(lm, prompt))
    rows = []
    for start in range(0, states.shape[0], _GEOMETRY_CHUNK):  # few float64 passes over W, bounded [chunk, V]
        terms = geometry_ablation(
            unembed, states[start : start + _GEOMETRY_CHUNK], norms, top_k, (cluster, 1.0, disperse)
        )
        for i in range(terms["v_eff"].shape[0]):
            orig = 1.0 / float(terms["frobenius_1"][i])
            clus = 1.0 / float(terms[f"frobenius_{cluster:g}"][i])
            disp = 1.0 / float(terms[f"frobenius_{disperse:g}"][i])
            v = float(terms["v_eff"][i])
            rows.append(
                {
                    "prompt": p_index,
                    "position": start + i,
                    "v_eff": v,
                    "band": v_eff_band(v),
                    "tcb_orig": orig,
                    "tcb_cluster": clus,
                    "tcb_disperse": disp,
                    "ordered": clus > orig > disp,
                }
            )
    return rows


def geometry(
    lm: LoadedModel,
    prompts: Sequence[str],
    top_k: int = TCBStudies.top_k,
    cluster: float = TCBStudies.cluster,
    disperse: float = TCBStudies.disperse,
    run: StudyRun | None = None,
) -> dict:
    """Every position of ``prompts``: δ as the model is, with the top-k rows clustered (α = ``cluster``) and
    dispersed (α = ``disperse``) around their weighted centroid, o fixed; per V_eff band the share ordered
    δ_cluster > δ_orig > δ_disperse. Units: one prompt, ``prompt-<index>``."""
    if not (0 <= cluster < 1 < disperse):
        raise InputError(f"need 0 ≤ cluster < 1 < disperse; got cluster {cluster}, disperse {disperse}")
    run = run or StudyRun()
    done, on_unit = run.done, run.on_unit
    unembed, norms = _unembedding(lm)
    rows = []
    for p_index, prompt in enumerate(prompts):
        key = f"prompt-{p_index}"
        if key not in done:
            done[key] = _geometry_rows(lm, unembed, norms, p_index, prompt, top_k, cluster, disperse)
            on_unit(key, done[key])
        rows += done[key]
    summary = []
    for band in ("<20", "20–100", ">100", "all"):
        members = [r for r in rows if band in ("all", r["band"])]
        share = sum(r["ordered"] for r in members) / len(members) if members else None
        summary.append({"band": band, "positions": len(members), "ordered_share": share})
    return {"rows": rows, "summary": summary}


TEMPLATES: dict[str, str] = {
    "bare": "{question}",
    "paper": "{question}\n\n" + MATH_INSTRUCTION,
    "terse": "{question}\n\nGive only the final number, as \\boxed{N}.",
    "expert": "You are a meticulous mathematician. Check every step.\n\n{question}\n\n" + MATH_INSTRUCTION,
}


def _fill(template: str, question: Question) -> str:
    # Not str.format: the templates contain LaTeX braces (\boxed{}).
    return TEMPLATES[template].replace("{question}", question.question)


def _messages(template: str, question: Question, shots: Sequence[Question]) -> list[dict[str, str]]:
    messages = []
    for shot in shots:  # worked examples as earlier turns, answered in the asked-for format
        messages.append({"role": "user", "content": _fill(template, shot)})
        messages.append({"role": "assistant", "content": f"The answer is \\boxed{{{shot.answer}}}."})
    messages.append({"role": "user", "content": _fill(template, question)})
    return messages


def _prompt_ids(lm: LoadedModel, messages: list[dict[str, str]]) -> list[int]:
    tok = lm.text_tokenizer(TEXT)
    if getattr(tok, "chat_template", None):
        return as_token_ids(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))
    return _encode(lm, "".join(f"{m['content']}\n\n" for m in messages))  # base models: turns as paragraphs


def prompt_variants(
    lm: LoadedModel,
    task: str = TCBStudies.task,
    questions: int = TCBStudies.questions,
    templates: Sequence[str] = tuple(TEMPLATES),
    shots: Sequence[int] = TCBStudies.shots,
    max_new_tokens: int = TCBStudies.prompts_max_new_tokens,
    task_config: dict[str, Any] | None = None,
    run: StudyRun | None = None,
) -> dict:
    """Greedy answers per template × shots: accuracy, perplexity of the answer, and its mean / median δ.

    Units: one answered question, ``<template>/<shots>/<question id>``. ``run.engine`` generates the answers.
    """
    run = run or StudyRun()
    done, on_unit = run.done, run.on_unit
    unknown = [t for t in templates if t not in TEMPLATES]
    if unknown:
        raise InputError(f"unknown template(s) {unknown}; known: {', '.join(TEMPLATES)}")
    qs = load_task(task, questions, run.seed, config=task_config)
    # Worked examples from a far-away seed (nearby reasoning-gym seeds share items), never the question itself.
    pool = load_task(task, max(shots, default=0) + len(qs), run.seed + 10_007, config=task_config)
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=max_new_tokens, readout_tokens=0)
    generator = make_backend(lm, run.engine, greedy)
    rows, summary = [], []
    for template in templates:
        for k in shots:
            for q in qs:
                key = f"{template}/{k}/{q.id}"
                if key not in done:
                    examples = [e for e in pool if e.question != q.question][:k]
                    done[key] = [_answer_row(lm, generator, template, k, q, examples)]
                    on_unit(key, done[key])
                rows += done[key]
            mine = [r for r in rows if r["template"] == template and r["shots"] == k]
            tcbs = torch.tensor([r["tcb_mean"] for r in mine], dtype=torch.float64)
            summary.append(
                {
                    "template": template,
                    "shots": k,
                    "accuracy": sum(r["correct"] for r in mine) / len(mine),
                    "perplexity": sum(r["perplexity"] for r in mine) / len(mine),
                    "tcb_mean": float(tcbs.mean()),
                    "tcb_median": float(tcbs.median()),
                }
            )
    return {"rows": rows, "summary": summary}


def _answer_row(
    lm: LoadedModel,
    generator: GenerationBackend,
    template: str,
    k: int,
    q: Question,
    examples: list[Question],
) -> dict[str, Any]:
    ids = _prompt_ids(lm, _messages(template, q, examples))
    trace = generator.start(ids, [0]).traces[0]
    graded = grade(q, lm.text_tokenizer(TEXT).decode(trace.token_ids, skip_special_tokens=True), trace.finish)
    s = score(lm, [{"id": q.id, "prompt_ids": ids, "completion_ids": trace.token_ids}], tcb=TCBConfig())[0]
    return {
        "template": template,
        "shots": k,
        "id": q.id,
        "correct": graded.correct,
        "answer": graded.answer,
        "perplexity": -s["neg_perplexity"],
        "tcb_mean": s["tcb_mean"],
        "token_count": s["token_count"],
    }


@dataclasses.dataclass(frozen=True)
class DropRule:
    """The sharp-drop rule of the generation trace (see ``metrics.tcb_geometry.sharp_drops``)."""

    window: int = TCBStudies.window
    factor: float = TCBStudies.factor
    max_perplexity: float = TCBStudies.max_perplexity


def generation_trace(
    lm: LoadedModel,
    prompt: str,
    max_new_tokens: int = TCBStudies.trace_max_new_tokens,
    rule: DropRule = DropRule(),
    chat: bool = TCBStudies.chat,
    run: StudyRun | None = None,
) -> dict:
    """A greedy generation's per-token δ, V_eff and perplexity, with sharp δ drops at low perplexity flagged.

    One unit, ``trace``: the whole result (a single generation has nothing smaller worth keeping).
    """
    run = run or StudyRun()
    if "trace" in run.done:
        return run.done["trace"]
    result = _generation_trace(lm, prompt, max_new_tokens, rule, chat, run.engine)
    run.on_unit("trace", result)
    return result


def _generation_trace(
    lm: LoadedModel, prompt: str, max_new_tokens: int, rule: DropRule, chat: bool, engine: EngineConfig
) -> dict:
    messages = [{"role": "user", "content": prompt}]
    ids = _prompt_ids(lm, messages) if chat else _encode(lm, prompt)
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=max_new_tokens, readout_tokens=0)
    trace = make_backend(lm, engine, greedy).start(ids, [0]).traces[0]
    record = {"id": "trace", "prompt_ids": ids, "completion_ids": trace.token_ids}
    scored = score(lm, [record], tokens=True)[0]
    tcb = torch.tensor(scored["tcb"], dtype=torch.float64)
    log_prob = torch.tensor(trace.log_prob, dtype=torch.float64)
    drops = sharp_drops(tcb, log_prob, rule.window, rule.factor, rule.max_perplexity)
    tokens = [lm.text_tokenizer(TEXT).decode([t]) for t in trace.token_ids]
    rows = [
        {
            "position": i,
            "token": tok,
            "tcb": float(tcb[i]),
            "v_eff": scored["v_eff"][i],
            "perplexity": math.exp(-float(log_prob[i])),
            "sharp_drop": bool(drops[i]),
        }
        for i, tok in enumerate(tokens)
    ]
    summary = {
        "tokens": len(rows),
        "sharp_drops": int(drops.sum()),
        "rule": dataclasses.asdict(rule),
        "text": lm.text_tokenizer(TEXT).decode(trace.token_ids, skip_special_tokens=True),
    }
    return {"rows": rows, "summary": summary}
