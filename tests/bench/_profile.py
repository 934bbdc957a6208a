"""torch.profiler over training steps: where the time goes, and how often the host waited for the device.

Used by ``gpu_train.py --profile``. The split sorts kernels (device time on CUDA; operators' own CPU time
on CPU) into matrix products, attention, log-prob head, optimizer, copies and casts, other elementwise
kernels and the rest; ``syncs_per_step`` counts the CUDA runtime calls that block the host
(``cudaStreamSynchronize``, ``cudaDeviceSynchronize``, ``cudaEventSynchronize``, synchronous ``cudaMemcpy``)
per profiled step. That count includes the bench's own timing (a ``torch.cuda.synchronize`` at each step's
start and end) and replay preparation (which reads the batch on the host once per generation batch); the
``gpu`` test ``test_padding_free_step_has_no_cuda_syncs_outside_logging`` checks the step itself.
"""

from __future__ import annotations

import re
import time
from typing import Any

CATEGORIES = (
    ("attention", r"flash|fmha|attention|sdpa|_efficient_attention|cudnn.*(fprop|bprop|sdp)"),
    ("matmul", r"gemm|cutlass|xmma|nvjet|matmul|\bmm\b|addmm|bmm|cublas|ampere_|sm90_|sm100_"),
    ("log-prob head", r"logprob|log_prob|logsumexp|softmax|cross_entropy|_chunked"),
    ("optimizer", r"adam|multi_tensor|foreach|fused_adam|_fused_"),
    ("copy/cast", r"copy|cast|to_copy|memcpy|convert|contiguous"),
    ("liger/triton", r"triton|liger|rms_norm|swiglu|rope"),
    ("elementwise", r"elementwise|vectorized|reduce|unrolled|mul|add|silu|exp"),
)
# Exact names: cudaMemcpyAsync (a pinned, non-blocking copy) does not block; .item() shows up as a
# cudaMemcpyAsync followed by a cudaStreamSynchronize.
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


class StepProfiler:
    """A ``TrainerCallback``-like pair of hooks profiling steps ``first`` to ``last`` (1-based, inclusive)."""

    def __init__(self, first: int, last: int, cuda: bool):
        import torch

        acts = [torch.profiler.ProfilerActivity.CPU]
        if cuda:
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        self.prof = torch.profiler.profile(activities=acts)
        self.first, self.last, self.cuda = first, last, cuda
        self.wall = 0.0
        self._t0 = 0.0

    def begin(self, step: int, sync: Any) -> None:
        if step == self.first:
            sync()
            self.prof.start()
            self._t0 = time.perf_counter()

    def end(self, step: int, sync: Any) -> None:
        if step == self.last:
            sync()
            self.wall = time.perf_counter() - self._t0
            self.prof.stop()

    def summary(self) -> dict[str, Any]:
        """The split (seconds and shares), the busy share of the wall and the host syncs per step."""
        events = self.prof.key_averages()
        steps = self.last - self.first + 1

        def own(e: Any) -> float:
            if self.cuda:
                return float(getattr(e, "self_device_time_total", 0) or 0)
            return float(e.self_cpu_time_total or 0)

        # On CPU every operator nests in others: only the aten operators' own time is the compute.
        rows = [(e.key, own(e)) for e in events if own(e) > 0 and (self.cuda or e.key.startswith("aten::"))]
        total = sum(t for _, t in rows) or 1.0
        split = {name: 0.0 for name, _ in CATEGORIES} | {"other": 0.0}
        for key, t in rows:
            name = next((n for n, rx in CATEGORIES if re.search(rx, key, re.I)), "other")
            split[name] += t
        syncs = sum(e.count for e in events if e.key in SYNC_CALLS)
        top = sorted(rows, key=lambda r: -r[1])[:8]
        return {
            "profiled_steps": steps,
            "wall_s": self.wall,
            "kernel_s": total / 1e6,
            "busy_share": (total / 1e6) / self.wall if self.wall and self.cuda else None,
            "split": {k: round(v / total, 4) for k, v in sorted(split.items(), key=lambda x: -x[1])},
            "syncs_per_step": syncs / steps if self.cuda else None,
            "top": [(k[:80], round(t / 1e3, 1)) for k, t in top],
        }


def split_line(p: dict[str, Any]) -> str:
    """One line for the table: the shares and the syncs per step."""
    shares = ", ".join(f"{k} {v:.0%}" for k, v in p["split"].items() if v >= 0.01)
    syncs = "n/a (CPU)" if p["syncs_per_step"] is None else f"{p['syncs_per_step']:.1f}"
    busy = "" if p["busy_share"] is None else f"; device busy {p['busy_share']:.0%} of the wall"
    return f"{shares}; host syncs per step: {syncs}{busy}"
