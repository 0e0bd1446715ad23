"""Everything that imports ``vllm`` (the ``depthlens[vllm]`` extra) lives in this package, and only here (an
import-linter contract): the engine and its generator, and the readout inside the engine's worker.

``engine`` starts the engine (readout worker, job-sized KV cache, quiet logs); ``generator`` samples on it
(``EngineGenerator``, the ``GenerationBackend``); ``prefill`` reads given completions out teacher forced
(``EngineScorer``); ``scores`` is the logits processor that records per-token scores; ``backend`` holds what needs
no engine (the install hint ``VLLM_MISSING``, ``check_source``); ``session`` (with ``groups``, ``requests`` and
``depth``) steps one engine for many callers at once — the server's requests — each with its own readout window.
Modules that import vllm at their top (``worker``, ``cpu_worker``, ``gpu_worker``, ``capture``, ``scores``) are
reached only once ``--backend vllm`` is chosen, or inside vLLM's own worker processes; ``settings`` and ``lens``
import no vllm: they are shared by the driver (which writes a request's readout settings) and the worker (which
reads them). Importing this package imports no vllm.
"""
