"""Everything that imports ``vllm`` (the ``depthlens[vllm]`` extra) lives in this package, and only here (an
import-linter contract): the engine and its generator (``backend``), the logits processor that records per-token
scores inside the engine (``scores``). Importing this package imports no vllm."""
