"""An input's sha256 is remembered by the file's identity (output/hashcache.py): a source compiled again is not hashed
again, and a changed, touched or just-written file never gets a remembered hash.

The remembered value is proven used by planting a different one: real files, real stat, the real digest function.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from ortcompile.output import hashcache
from ortcompile.output.digest import digest_inputs
from ortcompile.output.hashcache import RACY_WINDOW_NS, Fingerprint, cached_sha256, remember_sha256

PLANTED = "f" * 64


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))


def _source(tmp_path: Path) -> tuple[Path, Path]:
    model, data = tmp_path / "m.onnx", tmp_path / "m.onnx.data"
    model.write_bytes(b"graph")
    data.write_bytes(os.urandom(hashcache.MIN_BYTES))
    return model, data


def _settled(path: Path) -> None:
    """Remember PLANTED for `path` as if it had been hashed well after its last change (not racy)."""
    fingerprint = Fingerprint.of(path)
    remember_sha256(path, fingerprint, PLANTED, fingerprint.ctime_ns + RACY_WINDOW_NS + 1)


def test_a_remembered_hash_is_used_while_the_file_is_unchanged(tmp_path: Path) -> None:
    model, data = _source(tmp_path)
    _settled(data)
    digest = digest_inputs(model, [data])
    assert dict((n, s) for n, _, s in digest.files) == {"m.onnx": hashlib.sha256(b"graph").hexdigest(), "m.onnx.data": PLANTED}


def test_changed_bytes_of_the_same_size_are_hashed_again(tmp_path: Path) -> None:
    model, data = _source(tmp_path)
    _settled(data)
    stat = data.stat()
    zeros = b"\0" * hashcache.MIN_BYTES
    data.write_bytes(zeros)
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # mtime set back: ctime still moved
    digest = digest_inputs(model, [data])
    assert digest.files[1] == ("m.onnx.data", len(zeros), hashlib.sha256(zeros).hexdigest())


def test_a_file_hashed_in_the_tick_it_was_written_is_not_trusted(tmp_path: Path) -> None:
    model, data = _source(tmp_path)
    digest_inputs(model, [data])  # just written: its entry is racy
    assert cached_sha256(data, Fingerprint.of(data)) is None
    entry = hashcache._entry_path(data)
    entry.write_text(entry.read_text().replace(hashlib.sha256(data.read_bytes()).hexdigest(), PLANTED))
    assert digest_inputs(model, [data]).files[1][2] == hashlib.sha256(data.read_bytes()).hexdigest()


def test_an_entry_for_another_path_or_a_damaged_entry_is_ignored(tmp_path: Path) -> None:
    model, data = _source(tmp_path)
    _settled(data)
    entry = hashcache._entry_path(data)
    entry.write_text(entry.read_text().replace(str(data), str(model)))  # a key collision must not lend a hash
    assert cached_sha256(data, Fingerprint.of(data)) is None
    entry.write_text("{not json")
    assert cached_sha256(data, Fingerprint.of(data)) is None
    assert digest_inputs(model, [data]).files[1][2] == hashlib.sha256(data.read_bytes()).hexdigest()


def test_small_files_are_hashed_not_remembered(tmp_path: Path) -> None:
    model, data = _source(tmp_path)
    _settled(model)  # under MIN_BYTES: nothing is kept, and a planted entry is never read
    assert not hashcache._entry_path(model).exists()
    assert digest_inputs(model, [data]).files[0][2] == hashlib.sha256(b"graph").hexdigest()


def _weight_files(tmp_path: Path, count: int) -> list[Path]:
    """`count` files of random bytes, each just big enough to be cached (MIN_BYTES)."""
    files = [tmp_path / f"w{index}.data" for index in range(count)]
    for path in files:
        path.write_bytes(os.urandom(hashcache.MIN_BYTES))
    return files


def test_the_cache_forgets_files_that_are_gone_once_it_is_full(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hashcache, "MAX_ENTRIES", 3)
    files = _weight_files(tmp_path, 3)
    _settled(files[0])
    _settled(files[1])
    files[0].unlink()
    _settled(files[2])  # the third entry fills the cache: w0's entry (its file is gone) is dropped
    kept = sorted(p.name for p in (tmp_path / "xdg" / "ortcompile" / "hashes").glob("*.json"))
    assert kept == sorted(hashcache._entry_path(f).name for f in files[1:])


def test_a_cache_full_of_live_files_forgets_its_oldest_quarter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hashcache, "MAX_ENTRIES", 5)
    files = _weight_files(tmp_path, 5)
    for index, path in enumerate(files):
        _settled(path)
        entry = hashcache._entry_path(path)
        os.utime(entry, ns=(index * 10**9, index * 10**9))  # written in this order
    kept = {p.name for p in (tmp_path / "xdg" / "ortcompile" / "hashes").glob("*.json")}
    assert kept == {hashcache._entry_path(f).name for f in files[1:]}  # w0, the oldest, went when w4 came
