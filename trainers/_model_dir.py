"""Model directories that appear whole or not at all, and the checks of a model directory and of --model.

tracerl writes a model directory (``tracerl sft``, ``tracerl model``, the loop's ``best/`` and ``final/``,
``tracerl train``'s ``final/``) aside, in a hidden sibling ``.<name>.tracerl-writing-<pid>-<random>`` that
holds :data:`WRITING_MARK`; the last step writes :data:`COMPLETE_MARK` (what wrote it, and the size of every
file) and renames the sibling into place. A directory that already stands there (a finished earlier run) is
swapped out in one step (``renameat2(RENAME_EXCHANGE)`` on Linux; elsewhere two renames) and removed after, so
a process killed at any moment leaves either the old whole directory or the new whole one, never a mix.

The rule :func:`check_model_dir` applies (the loop's model check, the policy server when it loads a
checkpoint, ``tracerl sft`` / ``tracerl train``'s ``--model``):

- a directory with :data:`COMPLETE_MARK` is whole when every file the mark lists is there, each weights
  file with the size it was written with (a tokenizer file edited by hand is the user's change);
- a directory with :data:`WRITING_MARK` is one tracerl did not finish (the aside itself, or a copy of it);
- a directory without either mark and without a model's ``config.json``, beside an aside that no live
  process writes any more (a killed run's), is refused: e.g. an empty one a library created early;
- a path that does not exist while such an aside does is named as a write that stopped;
- any other directory is loaded as it is: a Hugging Face checkpoint the user brings, or one written by
  another tool, needs no mark.

Example:
    >>> import tempfile
    >>> out = Path(tempfile.mkdtemp()) / "model"
    >>> with writing_model_dir(out, by="example") as aside:
    ...     _ = (aside / "config.json").write_text("{}")
    >>> sorted(p.name for p in out.iterdir())
    ['config.json', 'tracerl_complete.json']
    >>> check_model_dir(out)
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import secrets
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from sdk._host import pid_alive
from trainers.errors import UserError

__all__ = [
    "COMPLETE_MARK",
    "WRITING_MARK",
    "check_local_model",
    "check_model",
    "check_model_dir",
    "check_output_dir",
    "writing_model_dir",
]

#: Written last into a model directory tracerl wrote: what wrote it and the size of each of its files.
COMPLETE_MARK = "tracerl_complete.json"
#: Present while tracerl writes a model directory aside; never in a directory renamed into place.
WRITING_MARK = "tracerl_writing.json"
_ASIDE = ".tracerl-writing-"
_OLD = ".tracerl-old-"
# Files of a directory that make it a model or adapter directory, which a new one may replace.
_MODEL_FILES = ("config.json", "adapter_config.json", COMPLETE_MARK)
_WEIGHTS = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def _asides(out: Path) -> list[Path]:
    """The asides of ``out`` whose writer is gone (a killed run's), oldest name first."""
    found = []
    with contextlib.suppress(OSError):
        for p in out.parent.glob(f".{out.name}{_ASIDE}*"):
            pid = p.name[len(f".{out.name}{_ASIDE}") :].split("-")[0]
            if not (pid.isdigit() and pid_alive(int(pid))):
                found.append(p)
    return sorted(found)


def _mark(path: Path) -> dict | None:
    try:
        mark = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return mark if isinstance(mark, dict) else None


def check_model_dir(path: str | os.PathLike[str]) -> None:
    """Refuse a model directory tracerl did not finish writing (the rule is in the module docstring).

    Raises:
        UserError: One line saying what is missing and how to get it whole.

    Example:
        >>> check_model_dir(".")  # a directory without marks is taken as it is
    """
    p = Path(path).expanduser()
    if not p.is_dir():
        aside = _asides(p) if not p.exists() else []
        if aside:
            by = (_mark(aside[-1] / WRITING_MARK) or {}).get("by", "tracerl")
            raise UserError(
                f"{p} was never completed: {by} stopped while writing it (what it wrote is in {aside[-1]}); "
                "run it again"
            )
        return
    writing = _mark(p / WRITING_MARK)
    if writing is not None or (p / WRITING_MARK).exists():
        by = (writing or {}).get("by", "tracerl")
        raise UserError(
            f"{p} is a model directory {by} did not finish writing (no {COMPLETE_MARK}); run it again"
        )
    mark = _mark(p / COMPLETE_MARK)
    if mark is None:
        if (p / COMPLETE_MARK).exists():
            raise UserError(f"{p}: {COMPLETE_MARK} is unreadable; write the directory again")
        aside = [] if any((p / f).is_file() for f in _MODEL_FILES) else _asides(p)
        if aside:  # e.g. an empty directory a library made before the kill
            by = (_mark(aside[-1] / WRITING_MARK) or {}).get("by", "tracerl")
            raise UserError(
                f"{p} is incomplete: {by} stopped while writing it (no {COMPLETE_MARK}; its partial files "
                f"are in {aside[-1]}); run it again"
            )
        return
    files = mark.get("files") if isinstance(mark.get("files"), dict) else {}
    for name, size in sorted(files.items()):
        try:
            have = (p / name).stat().st_size
        except OSError:
            raise UserError(
                f"{p} is incomplete: {name} is missing ({COMPLETE_MARK} lists {len(files)} files)"
            ) from None
        # Weights only: a tokenizer or generation config edited by hand is the user's change, a weights file
        # of another size a torn or damaged copy.
        if name.endswith(_WEIGHTS) and have != size:
            raise UserError(
                f"{p} is incomplete: {name} has {have} bytes, {COMPLETE_MARK} says {size} (delete the mark "
                "if you changed the weights on purpose)"
            )


def check_model(model: str) -> str:
    """Validate ``--model``: an existing local directory, or something that can only be a hub id.

    A name whose first part is a local directory (``runs/bse`` next to ``runs/``) is a path.

    Raises:
        UserError: Empty, or a path-like value that does not exist.

    Example:
        >>> check_model("Qwen/Qwen2.5-0.5B-Instruct")
        'Qwen/Qwen2.5-0.5B-Instruct'
    """
    if not model:
        raise UserError("no model given: pass --model PATH_OR_HUB_ID (or set 'model' in the config file)")
    check_model_dir(model)  # a directory tracerl did not finish writing (a killed `tracerl sft`)
    path = Path(model).expanduser()
    if path.exists():
        return str(path)
    # "runs/base2" where ./runs exists can only mean a local directory: a hub download would retry for a
    # minute before failing.
    path_like = (
        model.startswith(("/", ".", "~"))
        or model.count("/") > 1
        or model.endswith("/")
        or os.sep != "/"
        and os.sep in model
        or "/" in model
        and Path(model.split("/")[0]).is_dir()
    )
    if path_like:
        raise UserError(f"model path not found: {model}")
    return model


def check_local_model(model: str) -> None:
    """A model this machine can load without the network: a directory, or a hub model already downloaded.

    What the loop's policy server starts on (a download would need the network, and fail mid-start
    without it).

    Raises:
        UserError: Neither, or a directory tracerl did not finish writing (:func:`check_model_dir`).

    Example:
        >>> check_local_model(".")
    """
    check_model_dir(model)  # a directory tracerl did not finish writing: one line saying what is missing
    if Path(model).expanduser().is_dir():
        return
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - comes with transformers
        return
    if not isinstance(try_to_load_from_cache(model, "config.json"), str):
        raise UserError(
            f"model {model!r} is neither a directory nor a model in the local Hugging Face cache; download "
            f"it first (huggingface-cli download {model} --local-dir DIR) and set model: DIR"
        )


def check_output_dir(out: str | os.PathLike[str]) -> Path:
    """Where a model directory may be written: a new path, an empty directory or a model directory.

    Checked before the work, so a long training run does not end on a path it cannot replace.

    Raises:
        UserError: ``out`` is a file, or a directory holding something else (it would be replaced whole).

    Example:
        >>> import tempfile
        >>> check_output_dir(Path(tempfile.mkdtemp()) / "new").name
        'new'
    """
    out = Path(out).expanduser()
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise UserError(f"{out} exists and is not a directory; choose another output directory")
    if out.is_dir() and not any((out / f).exists() for f in _MODEL_FILES):
        try:
            empty = not any(out.iterdir())
        except OSError as exc:
            raise UserError(f"cannot read {out}: {exc.strerror or exc}") from None
        if not empty:
            raise UserError(f"{out} exists and is not a model directory; choose another output directory")
    return out


@contextlib.contextmanager
def writing_model_dir(out: str | os.PathLike[str], *, by: str) -> Iterator[Path]:
    """Write a model directory aside and rename it into place (replacing one there) when the block ends.

    The block writes into the path it is given; when it raises, the aside is removed and ``out`` stays as
    it was. ``by`` names the writer in the marks (``"tracerl sft"``). Given the aside of an enclosing block
    of this process, it writes there directly and leaves the rest to that block.

    Raises:
        UserError: ``out`` cannot be replaced (see :func:`check_output_dir`).
        OSError: The aside cannot be created or renamed (a read-only or immutable parent, a full disk).

    Example:
        >>> import tempfile
        >>> out = Path(tempfile.mkdtemp()) / "m"
        >>> with writing_model_dir(out, by="example") as aside:
        ...     _ = (aside / "weights.bin").write_bytes(b"0" * 8)
        >>> json.loads((out / COMPLETE_MARK).read_text())["files"]
        {'weights.bin': 8}
    """
    out = Path(out).expanduser()
    if (_mark(out / WRITING_MARK) or {}).get("pid") == os.getpid():
        yield out  # the aside of an enclosing block of this process (a merge into ``best/``): it finishes it
        return
    check_output_dir(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in _asides(out):  # a killed run's: this write replaces what it meant to write
        shutil.rmtree(stale, ignore_errors=True)
    aside = out.parent / f".{out.name}{_ASIDE}{os.getpid()}-{secrets.token_hex(3)}"
    aside.mkdir()
    try:
        started = {"by": by, "pid": os.getpid(), "target": str(out), "started": _now()}
        (aside / WRITING_MARK).write_text(json.dumps(started) + "\n")
        yield aside
        (aside / WRITING_MARK).unlink()
        files = {
            str(f.relative_to(aside)): f.stat().st_size
            for f in sorted(aside.rglob("*"))
            if f.is_file() and f.name != COMPLETE_MARK
        }
        mark = {"by": by, "written": _now(), "tracerl": _version(), "files": files}
        with open(aside / COMPLETE_MARK, "w") as fh:
            fh.write(json.dumps(mark, indent=1) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        _into_place(aside, out)
    except BaseException:
        shutil.rmtree(aside, ignore_errors=True)
        raise
    _fsync_dir(out.parent)


def _into_place(aside: Path, out: Path) -> None:
    try:
        os.rename(aside, out)  # ``out`` absent, or an empty directory
        return
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
    if _exchange(aside, out):  # one step: ``aside`` now holds the old directory
        shutil.rmtree(aside, ignore_errors=True)
        return
    old = out.parent / f".{out.name}{_OLD}{secrets.token_hex(3)}"
    os.rename(out, old)
    os.rename(aside, out)
    shutil.rmtree(old, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2(RENAME_EXCHANGE)``); ``False`` where unsupported."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # a file system without it
        return False
    raise OSError(err, os.strerror(err), str(b))


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tracerl")
    except PackageNotFoundError:
        return "unknown"
