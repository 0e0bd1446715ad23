"""The precision a run reads a model at — the weights' quantisation and the forward pass's dtype — in `depthlens
models`, in every manifest and in the report (issue 52, item 3)."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from depthlens.config import EngineConfig, ScoreRun, StoreSpec
from depthlens.models import catalogue
from depthlens.models.load import wrap
from depthlens.models.precision import (
    gguf_quantisation,
    planned_precision,
    precision_of,
    weights_quantisation,
)
from depthlens.stores.files import manifest_path
from depthlens.studies.score import run_score
from depthlens.viz.report import _model_line
from tests.conftest import tiny_model


def _write_gguf(path, file_type: int):
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_file_type(file_type)
    writer.add_tensor("t", np.zeros(4, dtype="float32"))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("name", list(catalogue.CATALOGUE))
def test_each_catalogue_quantisation_is_the_one_its_gguf_header_names(name):
    entry = catalogue.CATALOGUE[name]
    assert f", {entry.quantisation}" in entry.description
    path = catalogue.cache_dir() / "gguf" / entry.gguf_file
    if not path.exists():
        pytest.skip(f"{entry.gguf_file} is not in the cache (`depthlens models --install {name}` fetches it)")
    assert gguf_quantisation(path) == entry.quantisation


def test_a_gguf_file_is_named_by_its_header_and_a_float_checkpoint_by_none(tmp_path):
    assert gguf_quantisation(_write_gguf(tmp_path / "m.gguf", 15)) == "Q4_K_M"  # LLAMA_FTYPE_MOSTLY_Q4_K_M
    assert weights_quantisation(str(tmp_path / "m.gguf")) == "Q4_K_M, dequantised to float32"
    assert weights_quantisation("smollm2-135m-instruct") == "Q4_1, dequantised to float32"
    (tmp_path / "float").mkdir()
    (tmp_path / "float" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert weights_quantisation(str(tmp_path / "float")) == "none"
    (tmp_path / "bnb").mkdir()
    quant = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    (tmp_path / "bnb" / "config.json").write_text(json.dumps({"quantization_config": quant}))
    assert weights_quantisation(str(tmp_path / "bnb")) == "bitsandbytes 4-bit"


def test_the_compute_dtype_is_the_models_own_or_the_engines():
    assert precision_of(wrap(tiny_model("llama"))) == {"weights": "none", "compute_dtype": "float32"}
    half = wrap(copy.deepcopy(tiny_model("llama")).to(torch.bfloat16))  # the cached one stays float32
    assert precision_of(half)["compute_dtype"] == "bfloat16"
    vllm = EngineConfig(backend="vllm")
    assert precision_of(wrap(tiny_model("llama")), vllm)["compute_dtype"] == "bfloat16"  # auto on the engine
    assert planned_precision("x", "auto", "cpu")["compute_dtype"] == "float32"
    assert planned_precision("x", "auto", "cuda")["compute_dtype"] == "bfloat16"
    assert planned_precision("x", "float16", "cuda")["compute_dtype"] == "float16"


def test_a_score_manifest_records_precision_and_an_older_store_still_resumes(tiny_llama, tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(
        "".join(
            json.dumps({"id": f"r{i}", "prompt_ids": [3, 4], "completion_ids": [5, 6]}) + "\n"
            for i in range(2)
        )
    )
    out = tmp_path / "out.jsonl"
    run_score(tiny_llama, ScoreRun(src, StoreSpec(out)))
    meta = manifest_path(out)
    manifest = json.loads(meta.read_text())
    assert manifest["precision"] == {"weights": "none", "compute_dtype": "float32"}
    del manifest["precision"]  # a store written before precision was recorded
    meta.write_text(json.dumps(manifest))
    run_score(tiny_llama, ScoreRun(src, StoreSpec(out, resume=True)))
    assert json.loads(meta.read_text())["precision"]["compute_dtype"] == "float32"


def test_the_report_names_the_precision_or_says_it_was_not_recorded():
    recorded = {"weights": "Q4_1, dequantised to float32", "compute_dtype": "float32"}
    assert _model_line("smollm2-135m-instruct", recorded) == (
        "Model `smollm2-135m-instruct`: weights Q4_1, dequantised to float32, forward pass in float32."
    )
    assert "weights Q4_1, dequantised to float32; precision not recorded" in _model_line(
        "smollm2-135m-instruct", None
    )
    assert _model_line("some/hub-model", None).endswith(
        "precision not recorded (a store written before depthlens recorded it)."
    )
