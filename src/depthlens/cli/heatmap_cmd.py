"""``depthlens heatmap``: one text's token × layer divergence heatmap (PNG and interactive HTML) and one token's
settling plot."""

from __future__ import annotations

from depthlens.cli import options as opt
from depthlens.cli import specs
from depthlens.cli.app import app, console, err_console, load_model, warn
from depthlens.config import DTRConfig, ModelSpec, ReadoutConfig
from depthlens.models.catalogue import DEFAULT_MODEL


@app.command("heatmap", short_help="One text's token × layer divergence heatmap.")
def heatmap(
    completion: opt.Completion,
    out: opt.FigureOut,
    prompt: opt.HeatmapPrompt = "",
    chat: opt.Chat = False,
    model: opt.Model = DEFAULT_MODEL,
    token: opt.Token = None,
    g: opt.G = DTRConfig.g,
    rho: opt.Rho = DTRConfig.rho,
    deep_rule: opt.DeepRuleOpt = DTRConfig.deep_rule,
    divergence: opt.DivergenceOpt = ReadoutConfig.divergence,
    lens: opt.LensOpt = ReadoutConfig.lens,
    settle: opt.SettleOpt = DTRConfig.settle,
    device: opt.Device = ModelSpec.device,
    dtype: opt.DType = ModelSpec.dtype,
    trust_remote_code: opt.TrustRemoteCode = ModelSpec.trust_remote_code,
    blocks: opt.Blocks = None,
    final_norm_path: opt.FinalNormPath = None,
    unembed: opt.Unembed = None,
) -> None:
    """One text's token × layer divergence heatmap (PNG and interactive HTML) and one token's settling plot."""
    model_spec = specs.model_spec(locals())
    import json

    from depthlens.config import degenerate_settings
    from depthlens.errors import InputError
    from depthlens.metrics.dtr import deep_threshold
    from depthlens.studies.score import score
    from depthlens.viz.heatmap import draw_divergence_heatmap, write_heatmap_html
    from depthlens.viz.study import draw_token_settling

    if not completion:
        raise InputError("--completion is empty: give the text to read out")
    if token is not None and token < 0:
        raise InputError(f"--token {token}: give a token index, 0 or more")
    dtr = DTRConfig(g=g, rho=rho, deep_rule=deep_rule, settle=settle)  # type: ignore[arg-type]
    readout = ReadoutConfig(divergence=divergence, lens=lens)  # type: ignore[arg-type]
    for line in degenerate_settings(readout, dtr):
        warn(line)
    lm = load_model(model_spec)
    data = {"id": "text", "completion": completion}
    data.update({"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt})
    with err_console.status("reading out every layer"):
        (record,) = score(lm, [data], readout=readout, dtr=dtr, tcb=None, tokens=True)
    if not record["token_count"]:
        raise InputError(f"--completion {completion!r} has no tokens for {model}'s tokenizer; give some text")
    unit = {"jsd": "bits", "jsd-nat": "nats", "kl": "nats", "cosine": "1 − cos"}[divergence]
    out.mkdir(parents=True, exist_ok=True)
    (out / "record.json").write_text(json.dumps(record) + "\n")
    read = ("" if lens == "logit" else " through the tuned lens") + ("" if settle == "jsd" else f", {settle}")
    title = f"{model}: {divergence.upper()} to the final layer ({unit}){read}; DTR = {record['dtr']:.2f}"
    paths = [
        draw_divergence_heatmap(record, out / "heatmap.png", title=title),
        write_heatmap_html(record, out / "heatmap.html", title=title, unit=unit),
    ]
    n = len(record["settling_depth"])
    t = max(range(n), key=lambda i: record["settling_depth"][i]) if token is None else token
    if not 0 <= t < n:
        raise InputError(f"--token {token}: the completion has {n} tokens (0 … {n - 1})")
    paths.append(
        draw_token_settling(
            record["divergence"][t],
            g,
            deep_threshold(lm.n_layers, rho, deep_rule),  # type: ignore[arg-type]
            out / "token.png",
            token=record["tokens"][t],
            unit=unit,
        )
    )
    console.print(
        f"{n} tokens · DTR {record['dtr']:.2f} · mean settling depth {record['mean_settling_depth']:.1f} "
        f"of {lm.n_layers} layers"
    )
    err_console.print(f"wrote {', '.join(p.name for p in paths)} and record.json to {out}")
