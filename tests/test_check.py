"""``depthlens check``: a whole store passes; each damage is listed with its one remedy; it changes nothing."""

from __future__ import annotations

import shutil

from depthlens.config import GenerateRun, SamplingConfig, StoreSpec
from depthlens.evals.tasks import Question
from depthlens.stores.samples import SHARDS
from depthlens.studies.generate import generate
from tests.test_cli import run


def _names(shards):
    return sorted(p.name for p in shards.glob("part-*.parquet"))


def test_check_lists_each_problem_with_its_safe_remedy(tiny_chat, tmp_path, monkeypatch, capsys):
    questions = [Question(f"q{i}", f"{i} + {i}", str(2 * i)) for i in range(2)]
    sampling = SamplingConfig(max_new_tokens=4, readout_tokens=None)
    for name, batch in (("s", 1), ("other", 2)):
        generate(
            tiny_chat,
            GenerateRun(StoreSpec(tmp_path / name), pool=2, sampling=sampling, batch_size=batch),
            questions,
        )
    store, shards = tmp_path / "s", tmp_path / "s" / SHARDS
    code, out, _ = run(monkeypatch, capsys, "check", store)
    assert (
        code == 0
        and "4 shard(s), 4 committed record(s)" in out
        and "ok: every committed record is whole" in out
    )
    names = _names(shards)
    (shards / names[0]).unlink()  # lost
    cut = shards / names[1]
    cut.write_bytes(cut.read_bytes()[:100])  # cut
    changed = bytearray((shards / names[2]).read_bytes())
    changed[200] ^= 0xFF  # same size, other bytes: only the hash sees it
    (shards / names[2]).write_bytes(bytes(changed))
    shutil.copy(
        sorted((tmp_path / "other" / SHARDS).glob("part-*.parquet"))[0], shards / "part-000050.parquet"
    )
    before = sorted(p.name for p in shards.iterdir())
    code, out, _ = run(monkeypatch, capsys, "check", store)
    text = " ".join(out.split())
    assert code == 1 and "4 problem(s)" in text
    assert (
        f"missing: {shards / names[0]}: a shard the manifest lists is missing remedy: rerun the command"
        in text
    )
    assert f"cut: {cut}: cut short (100 bytes, fewer than committed) remedy: rerun" in text
    assert (
        f"changed: {shards / names[2]}: its content changed since it was committed (sha256 differs)" in text
    )
    assert "part-000050.parquet: a data file the manifest does not list (of another run" in text
    assert "remedy: move it out of the store" in text
    assert "delete" not in text and "regenerate" not in text  # only safe remedies
    assert sorted(p.name for p in shards.iterdir()) == before  # check reads only
    code, out, _ = run(monkeypatch, capsys, "check", store, "--quick")
    assert (
        code == 1 and "sha256 differs" not in out
    )  # without hashes, bytes changed in place go unseen by size
