"""Full weights into a running ``vllm serve`` in place, through vLLM's weight-transfer routes.

Written against vLLM 0.33's documented path (the routes moved and changed between 0.23 and 0.33; older
servers are not supported). The server runs with ``VLLM_SERVER_DEV_MODE=1`` and
``--weight-transfer-config '{"backend": "nccl"}'`` (:class:`~trainers.serve.policy.VLLMPolicy` with
``weight_transfer=True`` adds both). Once per server the trainer joins the group vLLM's workers open
(``GET /get_world_size``; ``POST /init_weight_transfer_engine`` while this process joins as rank 0, the
workers at ranks 1..N). Then each push is:

1. ``POST /pause?mode=keep``: new requests wait in vLLM's queue and the ones generating are frozen;
2. ``POST /start_weight_update``;
3. ``POST /update_weights`` with the names, dtypes and shapes, while the tensors go over the data plane in
   that order (NCCL: one broadcast per tensor from rank 0);
4. ``POST /finish_weight_update`` with the version, then ``POST /resume``.

Requests frozen by the pause continue on the new weights: their tokens before the push were sampled by
the old version, the ones after by the new one (each token's logprob is the one of the weights that
sampled it). Agents never see an error for the push (``mode=keep``: nothing is rejected).

The data plane is a :class:`WeightSender`: :class:`NCCLSender` (vLLM's own trainer-side NCCL helper, on
the current CUDA device) by default; tests drive the HTTP side against a scripted stand-in with a socket
sender, since NCCL needs GPUs on both sides.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any, Protocol

from trainers.errors import UserError

__all__ = ["NCCLSender", "VLLMWeightTransfer", "WeightSender"]


class WeightSender(Protocol):
    """The trainer's end of the data plane vLLM's workers receive the tensors on."""

    def join(self, master_address: str, master_port: int, world_size: int) -> None:
        """Join the group as rank 0 (returns once every worker has joined)."""

    def send(self, tensors: Iterable[Any]) -> None:
        """Send the tensors, in the order of the names given to ``/update_weights``."""

    def close(self) -> None:
        """Leave the group."""


class NCCLSender:
    """vLLM's NCCL backend: this process is rank 0 on the current CUDA device; one broadcast per tensor.

    Needs CUDA and vLLM installed in the trainer's environment (vLLM's ``trainer_init`` builds the
    communicator the workers' ``PyNcclCommunicator`` talks to).

    Example:
        >>> VLLMWeightTransfer("http://127.0.0.1:8000", NCCLSender())  # doctest: +SKIP
    """

    def __init__(self) -> None:
        self.group: Any = None

    def join(self, master_address: str, master_port: int, world_size: int) -> None:
        """Build vLLM's trainer-side communicator (rank 0; blocks until the workers join)."""
        try:
            from vllm.distributed.weight_transfer.nccl_common import trainer_init
        except ImportError as exc:
            raise UserError(f"weight_transfer needs vLLM (>= 0.33) beside the trainer: {exc}") from None
        info = {"master_address": master_address, "master_port": master_port, "world_size": world_size}
        self.group = trainer_init(info, rank=0)

    def send(self, tensors: Iterable[Any]) -> None:
        """Broadcast each tensor from this GPU (vLLM's unpacked mode: one collective per tensor)."""
        import torch

        stream = torch.cuda.current_stream()
        for t in tensors:
            self.group.broadcast(t.to("cuda", non_blocking=True).contiguous(), src=0, stream=stream)
        stream.synchronize()

    def close(self) -> None:
        """Destroy the communicator."""
        if self.group is not None and hasattr(self.group, "destroy"):
            self.group.destroy()
        self.group = None


class VLLMWeightTransfer:
    """Push full weights into a ``vllm serve`` started with a weight-transfer config.

    Args:
        server: The server's root URL (``http://host:port``; a trailing ``/v1`` is dropped).
        sender: The data plane: a :class:`WeightSender`, ``"module:factory"`` that makes one, or ``None``
            (:class:`NCCLSender`).
        master_address: The address vLLM's workers reach this process at (same host: ``127.0.0.1``).
        master_port: The rendezvous port (0: a free one).
        timeout: Seconds for each HTTP call.

    Example:
        >>> transfer = VLLMWeightTransfer("http://127.0.0.1:8000")  # doctest: +SKIP
        >>> transfer.push(model.state_dict(), version=3)  # doctest: +SKIP
        {'policy_version': 3, 'bytes': 988065792, 'seconds': 0.41}
    """

    def __init__(
        self,
        server: str,
        sender: WeightSender | str | None = None,
        *,
        master_address: str = "127.0.0.1",
        master_port: int = 0,
        timeout: float = 600.0,
    ) -> None:
        self.root = server.rstrip("/").removesuffix("/v1")
        if isinstance(sender, str):
            from sdk.rollout import load_function

            sender = load_function(sender, "weight sender")()
        self.sender: WeightSender = sender if sender is not None else NCCLSender()
        self.master_address, self.master_port, self.timeout = master_address, master_port, timeout
        self.joined = False
        self.broken: str | None = None

    def _call(self, path: str, body: dict[str, Any] | None = None, *, get: bool = False) -> dict[str, Any]:
        data = None if get else json.dumps(body or {}).encode()
        headers = {"Content-Type": "application/json"}
        method = "GET" if get else "POST"
        req = urllib.request.Request(self.root + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                text = resp.read().decode(errors="replace")
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:300]
            raise UserError(f"vLLM refused {path} ({exc.code}): {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise UserError(f"the vLLM server at {self.root} is gone ({path}: {exc})") from None
        try:
            return json.loads(text) if text.strip() else {}
        except ValueError:
            return {"message": text}

    def join(self) -> None:
        """Open the data plane once: vLLM's workers and this process join one group (both sides wait)."""
        if self.joined:
            return
        workers = int(self._call("/get_world_size", get=True)["world_size"])
        port = self.master_port
        if not port:  # a free one on the address the workers reach
            with socket.socket() as s:
                s.bind((self.master_address, 0))
                port = int(s.getsockname()[1])
        info = {"master_address": self.master_address, "master_port": port, "rank_offset": 1}
        info["world_size"] = workers + 1
        # The workers block in the rendezvous until this side joins: both at once.
        _side_by_side(
            lambda: self._call("/init_weight_transfer_engine", {"init_info": info}),
            lambda: self.sender.join(self.master_address, port, workers + 1),
        )
        self.joined = True

    def push(self, tensors: Mapping[str, Any], *, version: int) -> dict[str, Any]:
        """Serve ``tensors`` (checkpoint names) as ``version``; ``{"policy_version", "bytes", "seconds"}``.

        Raises:
            UserError: The server is gone or refused the weights. Before ``/start_weight_update`` the
                served weights are unchanged; after it they may be partly updated (the message says so).
        """
        if self.broken:
            raise UserError(self.broken)
        t0 = time.perf_counter()
        self.join()
        names = list(tensors)
        meta = {
            "names": names,
            "dtype_names": [str(tensors[n].dtype).removeprefix("torch.") for n in names],
            "shapes": [list(tensors[n].shape) for n in names],
        }
        self._call("/pause?mode=keep")
        try:
            self._call("/start_weight_update")
            try:
                self._transfer(tensors, meta)
                self._call("/finish_weight_update", {"weight_version": str(int(version))})
            except UserError as exc:
                self.broken = (
                    f"{exc}; the served weights may be partly updated: restart the server (re-run the same "
                    "command to continue from the last checkpoint)"
                )
                raise UserError(self.broken) from None
        finally:
            try:
                self._call("/resume")
            except UserError:
                if not self.broken:
                    raise
        moved = sum(t.numel() * t.element_size() for t in tensors.values())
        return {"policy_version": int(version), "bytes": moved, "seconds": round(time.perf_counter() - t0, 4)}

    def _transfer(self, tensors: Mapping[str, Any], meta: dict[str, Any]) -> None:
        """``/update_weights`` and the sender side by side (both take part in each collective)."""
        values = list(tensors.values())
        _side_by_side(
            lambda: self._call("/update_weights", {"update_info": meta}),
            lambda: self.sender.send(values),
        )

    def close(self) -> None:
        """Leave the group (the server's side stays until it stops)."""
        if self.joined:
            self.sender.close()
        self.joined = False


def _side_by_side(server: Any, local: Any) -> None:
    """Run an HTTP call to the server and this side's part of a collective at once.

    The first failure of either is the error (a ``UserError``). A side left blocked by the other's failure
    (a collective whose peer never comes) is not waited for: the group is unusable after it, which the
    caller records.
    """
    pool = ThreadPoolExecutor(2)
    try:
        futures = [pool.submit(server), pool.submit(local)]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        for f in futures:
            exc = f.exception() if f in done else None
            if isinstance(exc, UserError):
                raise exc
            if exc is not None:
                raise UserError(f"the weight transfer failed: {type(exc).__name__}: {exc}")
    finally:
        pool.shutdown(wait=False)
