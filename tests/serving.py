"""Helpers of the server tests: a tiny chat model saved where `depthlens serve` loads it, and a real server process
on 127.0.0.1 (started once per test module, stopped with SIGTERM, every wait bounded)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import char_tokenizer

SRC = Path(__file__).resolve().parents[1] / "src"
START_TIMEOUT = 300  # s: a vLLM engine starts in ~10-60 s on a loaded 2-core machine


def save_tiny_chat(path: Path) -> Path:
    """A random llama (3 layers, head size 32 so vLLM's CPU attention takes it) with a character tokenizer and a
    chat template; random weights scaled ×4 so the layers disagree (non-trivial divergences)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    tokenizer = char_tokenizer()
    config = AutoConfig.for_model(
        "llama",
        hidden_size=64,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
        vocab_size=len(tokenizer),
        max_position_embeddings=256,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                p.mul_(4.0)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`depthlens serve ARGS` on a free loopback port."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {
            **os.environ,
            "PYTHONPATH": str(SRC),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        }
        command = [
            sys.executable,
            "-c",
            "from depthlens.cli.app import main; main()",
            "serve",
            *args,
            "--port",
            str(self.port),
        ]
        self.log = log
        self._out = log.open("wb")
        self.proc = subprocess.Popen(command, env=env, stdout=self._out, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the server exited ({self.proc.returncode}):\n{self.log.read_text()[-3000:]}"
                )
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"{self.url}/health", timeout=5) as answer,
            ):
                if answer.status == 200:
                    return
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"the server did not answer within {timeout} s:\n{self.log.read_text()[-3000:]}")

    def health(self) -> dict:
        with urllib.request.urlopen(f"{self.url}/health", timeout=10) as response:
            return json.loads(response.read())

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM, then the exit code (killed after ``timeout``: the test then fails on it)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._out.close()
        return self.proc.returncode


@contextlib.contextmanager
def serving(args: list[str], log: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(args, log)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def wait_for(predicate: object, timeout: float = 30, every: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(every)
    return False
