"""Weights to a policy server process on a GPU through CUDA IPC: no copy through the host, no file.

The trainer packs a version's tensors into one flat buffer on its GPU (a device-to-device copy each: a
snapshot, so training can go on while the server reads it), shares the buffer with CUDA's interprocess
memory handles and posts the handles with a table of ``(name, dtype, shape, offset)`` as JSON to the
server's ``POST /admin/weights`` (content type :data:`CONTENT_TYPE`); the server opens the buffer, copies
the views into its model and answers, then the trainer drops the buffer. The handles, their reference
counts and the stream event that orders the copy before the read are torch's own
(``torch.multiprocessing.reductions``: what a CUDA tensor sent to a ``torch.multiprocessing`` child
carries), so memory is freed only once both sides let go.

Where a handle cannot be opened (the server on the CPU or another machine, a container without CUDA IPC),
the server answers 400 naming :data:`UNAVAILABLE` and the trainer sends the same tensors through the
host instead (a ``safetensors`` buffer over the loopback), saying so once
(:meth:`trainers.serve.policy.LocalPolicy.push`).

Needs CUDA on both sides: written against torch's reductions; without a GPU only the server's checks of a
push (a CPU server, a malformed table) run in the tests (``tests/serve/test_push.py``; its
``@pytest.mark.gpu`` test pushes through it on a GPU).

Example:
    >>> share({"w": torch.zeros(2)}) is None  # CPU tensors go through the host
    True
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

__all__ = ["CONTENT_TYPE", "UNAVAILABLE", "Shared", "collect", "receive", "share"]

CONTENT_TYPE = "application/x-tracerl-cuda-ipc+json"
"""The content type of a CUDA IPC push (a safetensors push is ``application/octet-stream``)."""

UNAVAILABLE = "cuda ipc unavailable"
"""What a server's 400 says when it cannot open the handles (the trainer then goes through the host)."""

_ALIGN = 256  # every tensor starts on a boundary any dtype can be viewed at
_DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32,
              torch.int16, torch.int8, torch.uint8, torch.bool)
}  # fmt: skip


class Shared(NamedTuple):
    """A push ready to post: its JSON ``body``, and the ``buffer`` to keep alive until the server answered.

    Example:
        >>> Shared(b"{}", None).body
        b'{}'
    """

    body: bytes
    buffer: Any


def share(
    tensors: Mapping[str, torch.Tensor], adapter_config: Mapping[str, Any] | None = None
) -> Shared | None:
    """Pack ``tensors`` into one shared buffer on their GPU; ``None`` unless all are on one CUDA device.

    Example:
        >>> share({"w": torch.zeros(2)}) is None
        True
    """
    devices = {t.device for t in tensors.values()}
    if len(devices) != 1 or next(iter(devices)).type != "cuda":
        return None
    if any(str(t.dtype).removeprefix("torch.") not in _DTYPES for t in tensors.values()):
        return None  # a dtype the table does not name (float8, complex): through the host
    from torch.multiprocessing.reductions import reduce_tensor

    entries, end = [], 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        shape = list(t.shape)
        entries.append(
            {
                "name": name,
                "dtype": str(t.dtype).removeprefix("torch."),
                "shape": shape,
                "offset": end,
                "nbytes": nbytes,
            }
        )
        end += -(-nbytes // _ALIGN) * _ALIGN
    buffer = torch.empty(max(end, 1), dtype=torch.uint8, device=next(iter(devices)))
    for e, t in zip(entries, tensors.values(), strict=True):
        if e["nbytes"]:
            flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
            buffer[e["offset"] : e["offset"] + e["nbytes"]].copy_(flat)
    args = reduce_tensor(buffer)[1]  # rebuild_cuda_tensor's arguments (torch.multiprocessing.reductions)
    handle = {
        "tensor_offset": args[3],
        "device": args[6],
        "handle": _b64(args[7]),
        "size": args[8],
        "offset": args[9],
        "ref_counter": _b64(args[11]),
        "ref_counter_offset": args[12],
        "event": _b64(args[13]),
        "event_sync": bool(args[14]),
        "numel": buffer.numel(),
    }
    body = {"handle": handle, "tensors": entries, "adapter_config": dict(adapter_config or {}) or None}
    return Shared(json.dumps(body).encode(), buffer)


def receive(body: bytes, device: torch.device) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None, Any]:
    """The tensors (views on the trainer's buffer), adapter config and the buffer of a :func:`share` push.

    Raises:
        ValueError: A malformed table; or, starting with :data:`UNAVAILABLE`, a handle this server cannot
            open (it runs on ``device``, not a GPU; or CUDA refused it).

    Example:
        >>> receive(b"{}", torch.device("cpu"))
        Traceback (most recent call last):
        ValueError: not a CUDA IPC push: KeyError: 'handle'
    """
    try:
        payload = json.loads(body)
        h, entries = payload["handle"], payload["tensors"]
        numel = int(h["numel"])
        table = [_entry(e, numel) for e in entries]
        config = payload.get("adapter_config")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a CUDA IPC push: {type(exc).__name__}: {exc}") from None
    if device.type != "cuda":
        raise ValueError(f"{UNAVAILABLE}: this server runs on {device}")
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    try:
        buffer = rebuild_cuda_tensor(
            torch.Tensor, torch.Size([numel]), (1,), int(h["tensor_offset"]), torch.storage.TypedStorage,
            torch.uint8, int(h["device"]), _unb64(h["handle"]), int(h["size"]), int(h["offset"]), False,
            _unb64(h["ref_counter"]), int(h["ref_counter_offset"]), _unb64(h["event"]), bool(h["event_sync"]),
        )  # fmt: skip
    except Exception as exc:  # CUDA reports a handle it cannot open as a RuntimeError of its own
        raise ValueError(f"{UNAVAILABLE}: {type(exc).__name__}: {str(exc).splitlines()[0]}") from None
    tensors = {
        name: buffer[offset : offset + nbytes].view(dtype).view(shape)
        for name, dtype, shape, offset, nbytes in table
    }
    return tensors, config, buffer


def collect() -> None:
    """Free the shared buffers the servers have let go of (torch keeps them until asked; a no-op on CPU).

    Example:
        >>> collect()
    """
    if torch.cuda.is_initialized():
        torch.cuda.ipc_collect()


def _entry(e: Mapping[str, Any], numel: int) -> tuple[str, torch.dtype, list[int], int, int]:
    name, dtype, shape = str(e["name"]), _DTYPES.get(str(e["dtype"])), [int(x) for x in e["shape"]]
    offset, nbytes = int(e["offset"]), int(e["nbytes"])
    if dtype is None:
        raise ValueError(f"tensor {name!r}: dtype {e['dtype']!r} is not one of {', '.join(_DTYPES)}")
    if min(shape, default=0) < 0 or nbytes != math.prod(shape) * dtype.itemsize:
        raise ValueError(f"tensor {name!r}: {nbytes} bytes do not hold shape {shape} of {e['dtype']}")
    if offset < 0 or offset % _ALIGN or offset + nbytes > numel:
        raise ValueError(f"tensor {name!r}: bytes {offset}..{offset + nbytes} are not in the buffer")
    return name, dtype, shape, offset, nbytes


def _b64(value: Any) -> str | None:
    return None if value is None else base64.b64encode(bytes(value)).decode()


def _unb64(value: Any) -> bytes | None:
    return None if value is None else base64.b64decode(value)
