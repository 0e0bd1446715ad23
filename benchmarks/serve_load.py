"""Load on `depthlens serve`: many clients at once against the same work through `depthlens generate`
(docs/performance.md, "The server under load").

    python benchmarks/serve_load.py --model smollm2-135m-instruct --backend vllm --requests 200 --concurrency 8 \
        --max-tokens 32 --readout-tokens 16 --duration 1200 --out docs/benchmarks/serve_load.json

1. Starts `depthlens serve` (a subprocess on 127.0.0.1) and waits for /health.
2. Warm-up: ``--concurrency`` requests, not counted.
3. ``--requests`` chat-free completions (token-id prompts: the paper prompts of distinct reasoning-gym chain_sum
   questions, one sample each, a seed per request) from ``--concurrency`` async openai clients at once; no new
   request is sent after ``--duration`` seconds. Per request: wall latency, generated tokens, errors. The server's
   RSS is sampled every 0.5 s.
4. Stops the server (SIGTERM; its exit code is recorded), then runs the questions the clients sent (all of them,
   unless ``--duration`` cut the run short), with the same settings and backend, through `depthlens generate`'s own
   code (``studies.generate.generate``, pool 1 per question, the engine started and warmed before the clock
   starts) and reports its tokens/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

SRC = Path(__file__).resolve().parents[1] / "src"


def _questions(count: int, seed: int) -> list:
    from depthlens.evals.loading import load_task

    return load_task("reasoning_gym:chain_sum", count, seed=seed)


def _prompts(model: str, questions: list) -> list[list[int]]:
    from transformers import AutoTokenizer

    from depthlens.models.locate import locate
    from depthlens.studies.generate import prompt_ids

    source = locate(model)
    tokenizer = AutoTokenizer.from_pretrained(str(source.path or model))
    shim = SimpleNamespace(tokenizer=tokenizer, name=model)
    return [prompt_ids(shim, q) for q in questions]  # type: ignore[arg-type]


def _start_server(args: argparse.Namespace, log: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [
        sys.executable,
        "-c",
        "from depthlens.cli.app import main; main()",
        "serve",
        "--model",
        args.model,
        "--backend",
        args.backend,
        "--device",
        "cpu",
        "--port",
        str(port),
        "--readout-tokens",
        str(args.readout_tokens),
        "--max-running",
        str(args.concurrency),
        *(["--enforce-eager"] if args.enforce_eager else []),
        *(["--kv-cache-gib", str(args.kv_cache_gib)] if args.kv_cache_gib else []),
    ]
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.Popen(command, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited: see {log}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(1)
    proc.kill()
    raise SystemExit(f"the server did not start in 600 s: see {log}")


class RSS(threading.Thread):
    """The server's resident memory every ``every`` s until stopped."""

    def __init__(self, pid: int, every: float = 0.5) -> None:
        super().__init__(daemon=True)
        import psutil

        self.process = psutil.Process(pid)
        self.every = every
        self.samples: list[tuple[float, int]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.samples.append((time.monotonic(), self.process.memory_info().rss))
            self.done.wait(self.every)


async def _load(url: str, args: argparse.Namespace, prompts: list[list[int]], seeds: list[int]) -> dict:
    import openai

    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="-", max_retries=0, timeout=args.duration)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(prompts)):
        queue.put_nowait(i)
    latencies, tokens, errors = [], 0, []
    began = time.monotonic()

    async def worker() -> None:
        nonlocal tokens
        while not queue.empty() and time.monotonic() - began < args.duration:
            i = queue.get_nowait()
            start = time.monotonic()
            try:
                r = await client.completions.create(
                    model=args.model,
                    prompt=prompts[i],
                    max_tokens=args.max_tokens,
                    temperature=0.6,
                    top_p=0.95,
                    seed=seeds[i],
                )
                tokens += r.usage.completion_tokens
                latencies.append(time.monotonic() - start)
            except Exception as exc:  # counted, with its kind: the run goes on
                errors.append(f"{type(exc).__name__}: {exc}"[:200])

    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    wall = time.monotonic() - began
    await client.close()
    return {
        "requests": len(latencies),
        "errors": len(errors),
        "error_examples": errors[:3],
        "wall_s": wall,
        "tokens": tokens,
        "tokens_per_s": tokens / wall,
        "requests_per_s": len(latencies) / wall,
        "latency_p50_s": statistics.median(latencies) if latencies else None,
        "latency_p99_s": sorted(latencies)[max(0, round(0.99 * len(latencies)) - 1)] if latencies else None,
        "not_sent": queue.qsize(),
    }


def _rss_summary(samples: list[tuple[float, int]]) -> dict:
    values = [rss / 2**20 for _, rss in samples]
    tenth = max(1, len(values) // 10)
    return {
        "samples": len(values),
        "first_tenth_median_mib": statistics.median(values[:tenth]),
        "last_tenth_median_mib": statistics.median(values[-tenth:]),
        "max_mib": max(values),
        "min_mib": min(values),
    }


def serve_phase(args: argparse.Namespace, prompts: list[list[int]]) -> dict:
    log = Path(tempfile.mkdtemp(prefix="serve-load-")) / "server.log"
    proc, url = _start_server(args, log)
    try:
        warm = [prompts[i % len(prompts)] for i in range(args.concurrency)]
        asyncio.run(
            _load(url, argparse.Namespace(**{**vars(args), "duration": 600}), warm, list(range(len(warm))))
        )
        rss = RSS(proc.pid)
        rss.start()
        result = asyncio.run(_load(url, args, prompts, [1000 + i for i in range(len(prompts))]))
        rss.done.set()
        rss.join()
        result["rss"] = _rss_summary(rss.samples)
        with urllib.request.urlopen(f"{url}/health", timeout=10) as r:
            result["health_after"] = json.loads(r.read())
    finally:
        proc.send_signal(signal.SIGTERM)
        result_code = proc.wait(120)
    result["exit_code"] = result_code
    result["server_log"] = str(log)
    return result


def generate_phase(args: argparse.Namespace, questions: list) -> dict:
    from depthlens.config import EngineConfig, GenerateRun, SamplingConfig, StoreSpec
    from depthlens.models.info import load_info
    from depthlens.models.load import load
    from depthlens.sampling.choose import make_backend
    from depthlens.studies.generate import generate

    # as `depthlens generate` loads it: vllm reads the layers out in its engine (tokenizer and config only here)
    lm = load_info(args.model) if args.backend == "vllm" else load(args.model, device="cpu")
    engine = EngineConfig(
        backend=args.backend, enforce_eager=args.enforce_eager, kv_cache_gib=args.kv_cache_gib
    )
    sampling = SamplingConfig(
        temperature=0.6, top_p=0.95, max_new_tokens=args.max_tokens, readout_tokens=args.readout_tokens
    )
    backend = make_backend(lm, engine, sampling)  # the engine starts here, before the clock
    out = Path(tempfile.mkdtemp(prefix="serve-load-generate-"))
    warm = GenerateRun(StoreSpec(out / "warm"), pool=1, batch_size=1, sampling=sampling, engine=engine)
    generate(lm, warm, questions[: args.concurrency], backend=backend)
    run = GenerateRun(StoreSpec(out / "run"), pool=1, batch_size=1, sampling=sampling, engine=engine)
    began = time.monotonic()
    report = generate(lm, run, questions, backend=backend)
    wall = time.monotonic() - began
    return {
        "responses": report.written,
        "failed": report.failed,
        "tokens": report.tokens,
        "wall_s": wall,
        "tokens_per_s": report.tokens / wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--backend", default="vllm", choices=["vllm", "hf"])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--readout-tokens", type=int, default=16)
    parser.add_argument(
        "--duration", type=float, default=1200, help="No request is sent after this many seconds."
    )
    parser.add_argument(
        "--enforce-eager", action="store_true", help="vLLM without torch.compile (both phases)."
    )
    parser.add_argument("--kv-cache-gib", type=float, help="vLLM's KV cache in GiB (both phases).")
    parser.add_argument("--skip-generate", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    questions = _questions(args.requests, seed=0)
    prompts = _prompts(args.model, questions)
    result = {
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "threads": os.environ.get("OMP_NUM_THREADS"),
        "load_average_before": os.getloadavg(),
    }
    result["serve"] = serve_phase(args, prompts)
    if not args.skip_generate:
        sent = len(questions) - result["serve"]["not_sent"]  # the same work as the clients asked for
        result["generate"] = generate_phase(args, questions[:sent])
        result["serve_vs_generate"] = result["serve"]["tokens_per_s"] / result["generate"]["tokens_per_s"]
    result["load_average_after"] = os.getloadavg()
    text = json.dumps(result, indent=2, default=str)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
