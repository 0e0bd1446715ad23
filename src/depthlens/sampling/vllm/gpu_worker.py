"""vLLM's GPU worker with the in-engine readout (``worker_cls`` on CUDA)."""

from __future__ import annotations

from vllm.v1.worker.gpu_worker import Worker

from depthlens.sampling.vllm.worker import ReadoutWorkerMixin


class ReadoutGPUWorker(ReadoutWorkerMixin, Worker):
    """vLLM's GPU ``Worker`` that reads the layers out of its own forward pass."""
