"""The model cache (``agents.models.pretrain.cached_build``): a build is used only while its
files are the ones it wrote, and a cache that cannot be used says so, naming it."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from rich.console import Console

from agents.models.pretrain import MANIFEST, cached_build, default_cache_root
from engine.errors import ModelUnavailable

REQUIRED = ("weights.bin", "config.json")


class Builder:
    """Counts its builds; each writes the same two files."""

    def __init__(self) -> None:
        self.builds = 0

    def __call__(self, into: Path) -> None:
        self.builds += 1
        (into / "config.json").write_text('{"layers": 1}')
        (into / "weights.bin").write_bytes(bytes(range(256)) * 64)


def test_a_damaged_build_is_built_again_not_used(tmp_path: Path) -> None:
    """Flipped bytes in a cached model were used silently by every later run (a different
    base model); a truncated one failed each run in its inference actor."""
    build = Builder()
    path = cached_build(tmp_path, "k", REQUIRED, build)
    assert build.builds == 1 and (path / MANIFEST).is_file()
    assert cached_build(tmp_path, "k", REQUIRED, build) == path and build.builds == 1
    data = bytearray((path / "weights.bin").read_bytes())
    data[100] ^= 0xFF
    (path / "weights.bin").write_bytes(bytes(data))
    assert cached_build(tmp_path, "k", REQUIRED, build) == path and build.builds == 2
    assert (path / "weights.bin").read_bytes() == bytes(range(256)) * 64
    (path / "config.json").write_text("")  # truncated
    cached_build(tmp_path, "k", REQUIRED, build)
    assert build.builds == 3
    (path / MANIFEST).write_text("not json")
    cached_build(tmp_path, "k", REQUIRED, build)
    assert build.builds == 4


def test_a_build_whose_manifest_is_gone_is_built_again(tmp_path: Path) -> None:
    """A build without its manifest was trusted and given a new one, over weights changed
    meanwhile: every build writes one (builds from before manifests have another key)."""
    build = Builder()
    path = cached_build(tmp_path, "k", REQUIRED, build)
    (path / "weights.bin").write_bytes(b"x")
    (path / MANIFEST).unlink()
    assert cached_build(tmp_path, "k", REQUIRED, build) == path and build.builds == 2
    assert (path / "weights.bin").read_bytes() == bytes(range(256)) * 64


def test_a_second_process_waiting_for_a_build_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A process waiting on another's build of the same model printed nothing for minutes."""
    import fcntl
    import threading

    from scenarios.cli.logsetup import configure_logging

    configure_logging(Console(stderr=True), "info")
    build = Builder()
    tmp_path.mkdir(exist_ok=True)
    with (tmp_path / "k.lock").open("a") as other:  # another process's build holds it
        fcntl.flock(other, fcntl.LOCK_EX)
        done = threading.Thread(target=cached_build, args=(tmp_path, "k", REQUIRED, build))
        done.start()
        done.join(0.5)
        assert done.is_alive()
        fcntl.flock(other, fcntl.LOCK_UN)
    done.join(10)
    assert build.builds == 1
    assert "pretrain.waiting" in capsys.readouterr().err


def test_a_full_cache_or_one_of_bytes_not_utf8_is_named(tmp_path: Path) -> None:
    """A full disk under the cache read "could not be built for this world" (after a build of
    minutes); a path that is not UTF-8 failed only once the build was written."""
    import errno
    import os

    def full(into: Path) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(ModelUnavailable, match=r"the model cache .* cannot be used: No space left"):
        cached_build(tmp_path, "k", REQUIRED, full)

    def safetensors_full(into: Path) -> None:
        raise Exception("I/O error: No space left on device (os error 28)")

    with pytest.raises(ModelUnavailable, match=r"the model cache .* cannot be used: No space left"):
        cached_build(tmp_path, "k", REQUIRED, safetensors_full)
    odd = Path(os.fsdecode(bytes(tmp_path) + b"/c\xff"))
    build = Builder()
    with pytest.raises(ModelUnavailable, match="its path holds bytes that are not UTF-8"):
        cached_build(odd, "k", REQUIRED, build)
    assert build.builds == 0


def test_a_cache_this_user_may_not_enter_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Looking into a cache directory this user may not enter (Python's ``is_file`` raises
    on EACCES) read "the embedded model could not be built for this world: PermissionError"."""
    from agents.models import pretrain

    def refused(path: Path, required: object) -> str:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    monkeypatch.setattr(pretrain, "_state", refused)
    build = Builder()
    with pytest.raises(ModelUnavailable, match=r"cannot be used: Permission denied \(COEVO_CACHE"):
        cached_build(tmp_path / "c", "k", REQUIRED, build)
    assert build.builds == 0


def test_a_cache_that_cannot_be_used_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read-only, missing or non-directory cache read "the embedded model could not be built
    for this world"; ``COEVO_CACHE='~/x'`` built into a directory named ``~``; ``HOME=""``
    put the cache in the working directory."""
    (tmp_path / "file").write_text("")
    with pytest.raises(ModelUnavailable, match=r"the model cache .*file/sub cannot be used: "):
        cached_build(tmp_path / "file" / "sub", "k", REQUIRED, Builder())
    monkeypatch.setenv("COEVO_CACHE", "~/somewhere")
    assert default_cache_root() == Path.home() / "somewhere"
    monkeypatch.setenv("COEVO_CACHE", "")
    monkeypatch.setenv("HOME", "")
    with pytest.raises(ModelUnavailable, match="HOME is empty and COEVO_CACHE is not set"):
        default_cache_root()


def test_a_cache_whose_path_leaves_no_room_for_a_build_is_refused_before_it(
    tmp_path: Path,
) -> None:
    """A ``COEVO_CACHE`` of about 4,080 bytes built the whole model (minutes, with the default
    one), then failed writing it, blamed on ``$.policy.model`` ("File name too long")."""
    from agents.models.pretrain import BUILD_PATHS

    longest = os.pathconf("/", "PC_PATH_MAX") - 1
    root, gap = tmp_path, longest - BUILD_PATHS - len(os.fsencode(tmp_path))
    while gap > 60:  # (each name at most 200 bytes: a file system's names hold 255)
        root = root / ("c" * min(200, gap - 50))
        gap = longest - BUILD_PATHS - len(os.fsencode(root))
    root.mkdir(parents=True)  # room for a key of 10 to 60 bytes below it
    build = Builder()
    with pytest.raises(ModelUnavailable, match=r"cannot be used: File name too long \(a build"):
        cached_build(root, "k" * 70, REQUIRED, build)
    assert build.builds == 0
    assert cached_build(root, "k", REQUIRED, build).is_dir() and build.builds == 1
