"""``depthlens heatmap``: one text's token × layer divergence heatmap (PNG and interactive HTML) and one token's
settling plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from depthlens.cli import groups
from depthlens.cli import options as opt
from depthlens.cli.app import app, console, err_console, load_model
from depthlens.config import DTRConfig, ReadoutConfig


@app.command("heatmap", short_help="One text's token × layer divergence heatmap.")
@groups.grouped
def heatmap(
    *,
    completion: opt.Completion,
    out: opt.FigureOut,
    prompt: opt.HeatmapPrompt = "",
    chat: opt.Chat = False,
    model: groups.Model,
    token: opt.Token = None,
    g: opt.G = DTRConfig.g,
    rho: opt.Rho = DTRConfig.rho,
    deep_rule: opt.DeepRuleOpt = DTRConfig.deep_rule,
    divergence: opt.DivergenceOpt = ReadoutConfig.divergence,
    lens: opt.LensOpt = str(ReadoutConfig.lens),
    settle: opt.SettleOpt = DTRConfig.settle,
    layers: groups.HeatmapLayers,
    arch: groups.Arch,
) -> None:
    """One text's token × layer divergence heatmap (PNG and interactive HTML) and one token's settling plot.

    Also the target trajectory (trajectory.png: each token's probability and rank at every layer, with --track's
    ids below; --no-layer-target leaves it out). With --layer-top-k K, the logit lens's own grid (logit_lens.png:
    each layer's top-1 token per token), and each heatmap cell's top-K tokens on the HTML page's hover."""
    from depthlens.cli.runs import say_warnings
    from depthlens.config import StoreSpec
    from depthlens.errors import InputError
    from depthlens.models.tokens import token_texts
    from depthlens.studies.runs import score_run
    from depthlens.studies.score import score
    from depthlens.studies.scoring import with_layer_top_tokens

    if not completion:
        raise InputError("--completion is empty: give the text to read out")
    if token is not None and token < 0:
        raise InputError(f"--token {token}: give a token index, 0 or more")
    built = score_run(  # one text, read out in memory: the run's checks and warnings, no store
        store=StoreSpec(Path()),
        readout={"divergence": divergence, "lens": lens, **layers.fields()},
        dtr={"g": g, "rho": rho, "deep_rule": deep_rule, "settle": settle},
        tcb=False,
        tokens=True,
    )
    say_warnings(built.warnings)
    readout, dtr = built.run.readout, built.run.dtr
    lm = load_model(model.spec(arch))
    data: dict[str, Any] = {"id": "text", "completion": completion}
    data.update({"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt})
    with err_console.status("reading out every layer"):
        (record,) = score(lm, [data], readout=readout, dtr=dtr, tcb=None, tokens=True)
    record = with_layer_top_tokens(record, lm.tokenizer)
    if readout.track:  # record.json says which ids the tracked rows are, and their texts label the plot
        record |= {
            "track": list(readout.track),
            "track_tokens": token_texts(lm.tokenizer, list(readout.track)),
        }
    if not record["token_count"]:
        raise InputError(
            f"--completion {completion!r} has no tokens for {model.model}'s tokenizer; give some text"
        )
    _draw(record, out, token, lm.n_layers, model.model, readout, dtr)


def _draw(
    record: dict[str, Any],
    out: Path,
    token: int | None,
    layers: int,
    model: str,
    readout: ReadoutConfig,
    dtr: DTRConfig,
) -> None:
    """The heatmap, its page and one token's settling plot (``token``, else the deepest-settling one)."""
    import json

    from depthlens.errors import InputError
    from depthlens.metrics.dtr import deep_threshold
    from depthlens.viz.heatmap import draw_divergence_heatmap, draw_logit_lens, write_heatmap_html
    from depthlens.viz.study import draw_token_settling

    unit = {"jsd": "bits", "jsd-nat": "nats", "kl": "nats", "cosine": "1 − cos"}[readout.divergence]
    out.mkdir(parents=True, exist_ok=True)
    (out / "record.json").write_text(json.dumps(record) + "\n")
    settle = dtr.settle
    read = ("" if readout.lens.path is None else f" through {readout.lens.describe()}") + (
        "" if settle == "jsd" else f", {settle}"
    )
    title = (
        f"{model}: {readout.divergence.upper()} to the final layer ({unit}){read}; DTR = {record['dtr']:.2f}"
    )
    draw_divergence_heatmap(record, out / "heatmap.png", title=title)
    paths = [out / "heatmap.png", write_heatmap_html(record, out / "heatmap.html", title=title, unit=unit)]
    lens = f" through {readout.lens.describe()}" if readout.lens.path is not None else " (the logit lens)"
    if "layer_top_tokens" in record:
        draw_logit_lens(
            record, out / "logit_lens.png", title=f"{model}: each layer's most probable token{lens}"
        )
        paths.append(out / "logit_lens.png")
    if readout.layer_target:
        paths.append(_trajectory(record, out, f"{model}: each token's probability and rank by layer{lens}"))
    n = len(record["settling_depth"])
    t = max(range(n), key=lambda i: record["settling_depth"][i]) if token is None else token
    if not 0 <= t < n:
        raise InputError(f"--token {token}: the completion has {n} tokens (0 … {n - 1})")
    paths.append(
        draw_token_settling(
            record["divergence"][t],
            dtr.g,
            deep_threshold(layers, dtr.rho, dtr.deep_rule),
            out / "token.png",
            token=record["tokens"][t],
            unit=unit,
        )
    )
    console.print(
        f"{n} tokens · DTR {record['dtr']:.2f} · mean settling depth {record['mean_settling_depth']:.1f} "
        f"of {layers} layers"
    )
    err_console.print(f"wrote {', '.join(p.name for p in paths)} and record.json to {out}")


def _trajectory(record: dict[str, Any], out: Path, title: str) -> Path:
    """The target trajectory (``viz.trajectory``), each tracked id labelled by its text and id."""
    from depthlens.viz.trajectory import draw_target_trajectory

    ids, texts = record.get("track", []), record.get("track_tokens", [])
    labels = [f"{text!r} #{i}" for i, text in zip(ids, texts, strict=True)]
    return draw_target_trajectory(record, out / "trajectory.png", title=title, track_labels=labels or None)
