"""The example commands of docs/cli.md, docs/view.md and the README, run as written at tiny sizes (issue 42,
item 7): each code block's `depthlens …` lines in order, in one working directory, on the tiny chat model, with the
sizes shrunk (questions, pool, n, tokens, steps) and nothing else changed — so a command a newcomer copies works,
and a block whose commands do not fit together (a store written to one name and read from another) fails here
first.

Not run: `view` and `serve` (servers that run until stopped: their own tests start them), and the vLLM, Ray or
GPU lines (`--backend vllm`, `--gpu-memory-utilization`, `--gpus`, `--ray`: tests/test_vllm_*.py and
tests/test_ray.py run those engines at their own sizes).
"""

from __future__ import annotations

import re
import shlex
import shutil
import sys
from pathlib import Path

import pytest

from depthlens.cli.app import main
from tests.serving import save_tiny_chat

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("docs/cli.md", "docs/view.md", "README.md", "docs/logit-lens.md")
SKIP = ("view", "serve")  # servers, started by their own tests
ENGINE_ONLY = ("--backend vllm", "--gpu-memory-utilization", "--gpus", "--ray")
SHRINK = {  # option → its tiny value
    "--questions": "2",
    "--pool": "4",
    "--n": "2",
    "--max-n": "4",
    "--warmup": "2",
    "--trials": "2",
    "--max-new-tokens": "8",
    "--steps": "2",
    "--max-tokens": "256",
    "--bootstrap": "50",
}
GENERATING = {"score", "generate", "thinkn", "heatmap", "fit"}  # the commands that load a model
ADDED = {"generate": ("--max-new-tokens", "8"), "thinkn": ("--max-new-tokens", "8"), "fit": ("--steps", "2")}
# A Jacobian lens's fit: two short prompts and two held out (its options; --steps is the tuned lens's).
JACOBIAN_FIT = ("--prompts", "2", "--prompt-tokens", "24", "--heldout-prompts", "2")
# Stores a block reads that no command of its document writes (the doc assumes the reader made them earlier):
# made from stores the documents' own commands wrote.
MADE_FROM = {"runs/study": "runs/arith", "runs/a": "runs/arith", "runs/qwen-chain": "runs/chain"}


def commands(doc: str) -> list[tuple[int, list[list[str]]]]:
    """Each fenced block's `depthlens` command lines (continuations joined, comments and `[optional]` parts
    dropped) as argument lists, with the block's line number."""
    blocks, lines, start, inside = [], [], 0, False
    for number, line in enumerate((ROOT / doc).read_text(encoding="utf-8").splitlines(), start=1):
        if line.startswith("```"):
            if inside and lines:
                blocks.append((start, lines))
            inside, lines, start = not inside, [], number
        elif inside:
            lines.append(line)
    out = []
    for start, body in blocks:
        text = re.sub(r"\\\n\s*", " ", "\n".join(body))
        found = [
            shlex.split(re.sub(r"\[[^\]]*\]", "", line), comments=True)[1:]
            for line in text.splitlines()
            if line.strip().startswith("depthlens ")
        ]
        if found:
            out.append((start, found))
    return out


def tiny(args: list[str], model: Path) -> list[str] | None:
    """``args`` at tiny sizes on ``model``; None for a line not run here (see the module docstring)."""
    line = " ".join(args)
    if args[0] in SKIP or any(flag in line for flag in ENGINE_ONLY):
        return None
    verb = args[1] if args[0] == "lens" else args[0]
    out, i = [], 0
    while i < len(args):
        flag = args[i]
        if flag in SHRINK and i + 1 < len(args):
            out += [flag, SHRINK[flag]]
            i += 2
        elif flag in ("--model", "-m") and i + 1 < len(args):
            out += [flag, str(model)]
            i += 2
        else:
            out.append(flag)
            i += 1
    if verb in GENERATING and "--from" not in out and "--model" not in out and "-m" not in out:
        out += ["--model", str(model)]
    extra = JACOBIAN_FIT if verb == "fit" and "jacobian" in args else ADDED.get(verb, ())
    for flag, value in zip(extra[::2], extra[1::2], strict=True):
        if flag not in out and "--from" not in out:
            out += [flag, value]
    if "--online" in out and "--warmup" not in out:
        out += ["--warmup", SHRINK["--warmup"]]  # the default warm-up is the whole of a tiny --max-n
    if "--prefix" in out and "--max-new-tokens" in out and out[out.index("--prefix") + 1].isdigit():
        # an online decision at ℓ needs responses that can reach ℓ tokens
        needed = int(out[out.index("--prefix") + 1]) + 4
        at = out.index("--max-new-tokens") + 1
        out[at] = str(max(int(out[at]), needed))
    if verb == "lens" and out[1] == "compare":
        out += ["--bootstrap", SHRINK["--bootstrap"]] if "--bootstrap" not in out else []
    return out


def run(monkeypatch, capsys, args: list[str]) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["depthlens", *args])
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as info:
        main()
    out, err = capsys.readouterr()
    return info.value.code or 0, out + err


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return save_tiny_chat(tmp_path_factory.mktemp("tiny-chat"))


CASES = [(doc, start, lines) for doc in DOCS for start, lines in commands(doc)]


def test_the_documents_have_commands_to_run():
    ran = [lines for _, _, lines in CASES]
    assert len(ran) >= 12 and sum(len(x) for x in ran) >= 20


@pytest.mark.parametrize(("doc", "start", "lines"), CASES, ids=[f"{d}:{s}" for d, s, _ in CASES])
def test_a_documented_block_runs_as_written(doc, start, lines, model, monkeypatch, capsys, tmp_path_factory):
    """Every block runs in the one working directory its document's blocks share (a later block reads what an
    earlier one wrote, as a reader following the document would), in order."""
    work = tmp_path_factory.getbasetemp() / f"docs-{Path(doc).stem}"
    work.mkdir(exist_ok=True)
    monkeypatch.chdir(work)
    for where in (work / "samples.jsonl", work / "examples" / "samples.jsonl"):  # as the documents name it
        where.parent.mkdir(exist_ok=True)
        if not where.exists():
            shutil.copy(ROOT / "examples" / "samples.jsonl", where)
    ran = 0
    for args in lines:
        shrunk = tiny(args, model)
        if shrunk is None:
            continue
        for path, source in MADE_FROM.items():
            if any(a == path or a.startswith(path + "/") for a in shrunk) and not Path(path).exists():
                if not Path(source).exists():
                    pytest.skip(
                        f"{doc}:{start}: reads {path}, made from {source}, which no earlier block wrote"
                    )
                target = Path(path) / Path(source).name if path == "runs/study" else Path(path)
                shutil.copytree(source, target)
        out = shrunk[shrunk.index("--out") + 1] if "--out" in shrunk else None
        if out is not None and args[0] in ("generate", "thinkn") and Path(out).exists():
            shutil.rmtree(out)  # another block's alternative way to the same store: start it afresh
        code, said = run(monkeypatch, capsys, shrunk)
        assert code == 0, (
            f"{doc}:{start}: `depthlens {' '.join(args)}` (run as {shrunk}) failed:\n{said[-3000:]}"
        )
        ran += 1
    if ran == 0:
        pytest.skip(f"{doc}:{start}: only lines not run here")
