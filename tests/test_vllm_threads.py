"""A vLLM engine stepped by the server's session thread runs on the intra-op thread count it was started with.

A sampling run on a CPU leaves its thread on one intra-op thread (``models.threads``); a new Python thread starts on
OpenMP's default (every core). The session's stepping thread used to run on that default, and vLLM's CPU attention
then refused the step ("Check failed: input->metadata->thread_num == thread_num (2 vs. 1)"): the engine failed, and a
request queued before the failure waited forever. Seen in the full suite, where earlier runs had set one thread.
Run in a fresh process, so that the engine's process-wide state is its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from depthlens.sampling.choose import vllm_available

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not vllm_available(), reason="needs the vllm extra: pip install 'depthlens[vllm]'"),
]
ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import sys, tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
import torch
from depthlens.config import EngineConfig, ReadoutConfig, SamplingConfig
from depthlens.models.info import load_info
from depthlens.sampling.vllm.depth import EngineDepth
from depthlens.sampling.vllm.engine import JobSize, start_engine
from depthlens.sampling.vllm.requests import SessionBackend
from depthlens.sampling.vllm.session import EngineSession
from tests.serving import save_tiny_chat

torch._C.set_num_threads(1)  # as a sampling run on a CPU leaves its thread
engine_config = EngineConfig(backend="vllm", dtype="float32", enforce_eager=True, max_model_len=256, kv_cache_gib=0.05)
info = load_info(str(save_tiny_chat(Path(tempfile.mkdtemp()) / "model")))
engine = start_engine(info, engine_config, JobSize(2, 256))
session = EngineSession(engine, EngineDepth(info, ReadoutConfig(), engine_config), sorted(info.end_ids), 2)
greedy = SamplingConfig(temperature=0.0, max_new_tokens=8, readout_tokens=None)
pool = ThreadPoolExecutor(3)
try:
    runs = [pool.submit(SessionBackend(session, greedy, layer_top_k=k).sample, [5, 6, 7, 8], [0]) for k in (3, 0)]
    print("lengths", [len(run.result(timeout=300)[0].token_ids) for run in runs])
finally:
    session.close()
    pool.shutdown()
"""


def test_the_session_thread_steps_on_the_engines_thread_count():
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # a new thread gets every core
    env.update(PYTHONPATH=f"{ROOT / 'src'}{os.pathsep}{ROOT}", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    env.setdefault("VLLM_HOST_IP", "127.0.0.1")
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "lengths [8, 8]" in done.stdout, done.stdout[-2000:]
