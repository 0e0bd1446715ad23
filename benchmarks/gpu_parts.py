"""The GPU suite's parts for issue 60 (benchmarks/gpu_suite.py registers them): each layer's top-k on ``score
--tokens``, δ_TCB exact and its share of ``score`` in bfloat16, and the sampler's compile setting. Each part runs
against whatever depthlens is on PYTHONPATH, so the same part measures a tree before and after a change.

``score_rows`` is the shape of a part that times ``score`` under a few settings against a bare forward of the same
tokens: a part for a new readout feature (the target trajectory, the Jacobian lens) is one row of
``gpu_suite.PARTS`` built from it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import torch

from gpu_common import Suite, record, sampler_batch
from overhead import counted_transfers

ScoreSettings = Callable[
    [], dict
]  # → keyword arguments of depthlens.studies.score.score (built when the part runs)


def bare_forward(suite: Suite, model: torch.nn.Module, rec: list[dict]) -> float:
    """Seconds of one forward over the record's tokens that keeps no logits but the last (the floor)."""
    x = torch.tensor([rec[0]["prompt_ids"] + rec[0]["completion_ids"]], device=suite.device)

    def forward() -> None:
        with torch.inference_mode():
            model(x, logits_to_keep=1)

    return suite.best(forward)


def score_rows(
    rows: dict[str, ScoreSettings], tokens: int = 8192, profile: str | None = None, repeats: int = 2
) -> Callable:
    """A part: ``score`` of one ``tokens``-token record (256 with ``--small``) under each row's settings, against a
    bare forward and the first row, with host transfers counted (in the timed calls: the wrappers cost nothing
    beside a call); each row guarded (a setting this tree lacks is an error row, not the end of the part); with
    ``profile``, that row's operators and kernels counted in one more call. A row costs 1 + ``repeats`` calls."""

    def part(suite: Suite, model: torch.nn.Module) -> dict:
        import depthlens
        from depthlens.studies.score import score

        lm = depthlens.wrap(model, name="qwen3-8b-shape")
        rec = record(model.config.vocab_size, 256 if suite.small else tokens)
        bare = bare_forward(suite, model, rec)
        out: dict = {"tokens": len(rec[0]["completion_ids"]), "bare_forward_s": bare, "rows": {}}
        first = None
        for name, settings in rows.items():
            try:
                kw = settings()
                with counted_transfers() as counts:
                    seconds = suite.best(lambda kw=kw: score(lm, rec, **kw), repeats)
                counts = {name: n // (1 + repeats) for name, n in counts.items()}  # per call
                first = seconds if first is None else first
                row = {
                    "seconds": seconds,
                    "vs_forward": round(seconds / bare, 2),
                    "host_transfers": dict(counts),
                }
                out["rows"][name] = {**row, "vs_first_row": round(seconds / first, 3)}
                if name == profile:
                    out["rows"][name]["profile"] = profiled(suite, lambda kw=kw: score(lm, rec, **kw))
            except Exception as exc:  # one setting's failure is a row
                out["rows"][name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        return out

    return part


def profiled(suite: Suite, fn: Callable[[], object], top: int = 12) -> dict:
    """One call under torch.profiler: operator calls and device kernels, the busiest operators by self time."""
    from torch.profiler import ProfilerActivity, profile

    cuda = suite.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        fn()
        suite.sync()
    events = prof.key_averages()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    aten = [e for e in events if e.key.startswith("aten::")]
    busiest = sorted(aten, key=lambda e: getattr(e, key, 0.0), reverse=True)[:top]
    calls = Counter({e.key: e.count for e in aten})
    return {
        "aten_calls": sum(calls.values()),
        "topk_calls": calls.get("aten::topk", 0),
        "busiest": {
            e.key: {"calls": e.count, "self_ms": round(getattr(e, key, 0.0) / 1e3, 2)} for e in busiest
        },
    }


def _layer_top(k: int) -> ScoreSettings:
    def settings() -> dict:
        from depthlens.config import ReadoutConfig

        return {"tokens": True, "readout": ReadoutConfig(layer_top_k=k)} if k else {"tokens": True}

    return settings


layer_top_k = score_rows({f"k{k}": _layer_top(k) for k in (0, 5, 20)}, profile="k5", repeats=1)
"""``score --tokens`` with each layer's top-K, K = 0 / 5 / 20 (goal: K = 5 and 20 ≤ 1.10× K = 0 on the H200)."""


def _tcb(kind: str) -> ScoreSettings:
    def settings() -> dict:
        from depthlens.config import TCBConfig

        return {"no_tcb": {"tcb": None}, "default": {}, "exact": {"tcb": TCBConfig(exact=True)}}[kind]

    return settings


_tcb_times = score_rows({kind: _tcb(kind) for kind in ("no_tcb", "default", "exact")})


def tcb(suite: Suite, model: torch.nn.Module) -> dict:
    """``score`` without TCB, with it (float32) and exact (float64 from the bf16 weights): TCB's share of ``score``
    (goal ≤ 10 %), and the per-token float32 δ against the exact one on the same tokens."""
    import depthlens
    from depthlens.config import TCBConfig
    from depthlens.studies.score import score

    out = _tcb_times(suite, model)
    rows = out["rows"]
    if "seconds" in rows.get("default", {}) and "seconds" in rows.get("no_tcb", {}):
        out["tcb_share_of_score"] = round(1 - rows["no_tcb"]["seconds"] / rows["default"]["seconds"], 3)
    try:
        lm = depthlens.wrap(model, name="qwen3-8b-shape")
        rec = record(model.config.vocab_size, 64 if suite.small else 1024)
        fast = torch.tensor(score(lm, rec, tokens=True)[0]["tcb"], dtype=torch.float64)
        exact = torch.tensor(
            score(lm, rec, tokens=True, tcb=TCBConfig(exact=True))[0]["tcb"], dtype=torch.float64
        )
        out["float32_vs_exact_max_rel"] = float(((fast - exact).abs() / exact.abs()).max())
    except Exception as exc:  # the comparison is a row too
        out["float32_vs_exact_max_rel"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    return out


def sampler_compile(suite: Suite, model: torch.nn.Module) -> dict:
    """The HF sampler reading every token out, ``compile`` auto / off (and ``on`` on a CPU, where auto is eager at
    first; on CUDA auto compiles from the first step) and auto with each layer's top-5, against ``model.generate``
    (the first, full-batch warm-up); one timed call each after a warm-up (a device lease is short). ``--small``
    leaves ``on`` out (no minute of C++ compilation in a CPU dry run)."""
    import depthlens
    from depthlens.config import ReadoutConfig, SamplingConfig
    from depthlens.sampling.hf import HFGenerator

    lm = depthlens.wrap(model, name="qwen3-8b-shape")
    n, new, prompt, generate = sampler_batch(suite, model)
    reference = suite.best(generate, repeats=1)
    rows: dict = {"generate": {"seconds": reference, "tokens_per_s": round(n * new / reference, 1)}}
    settings = {
        "auto": {},
        "off": {"compile": "off"},
        "on": {"compile": "on"},
        "auto_top5": {"layer_top_k": 5},
    }
    for name, kw in settings.items():
        if name == "on" and (suite.small or suite.device.type == "cuda"):  # on CUDA, auto is on (issue 49)
            continue
        try:
            gen = HFGenerator(
                lm, SamplingConfig(max_new_tokens=new, readout_tokens=None), ReadoutConfig(**kw)
            )
            seconds = suite.best(lambda gen=gen: gen.sample(prompt, list(range(n))), repeats=1)
            rows[name] = {"seconds": seconds, "vs_generate": round(reference / seconds, 3)}
        except Exception as exc:  # one setting's failure is a row
            rows[name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    return {"n": n, "new_tokens": new, "rows": rows}
