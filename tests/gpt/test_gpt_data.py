"""The stdlib corpus: selection, deterministic split, cache, batches."""
import sys
from pathlib import Path

import pytest
import torch

from helpers.gpt import data


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def fake_root(tmp_path):
    """A small stdlib look-alike: 40 modules, plus test packages and site-packages to be skipped."""
    root = tmp_path / "lib"
    for i in range(40):
        _write(root, f"pkg{i % 4}/mod{i:02d}.py", f"# module {i}\nVALUE = {i}\n")
    _write(root, "top.py", "print('hello')\n")
    for rel in ("test/test_x.py", "pkg0/tests/test_y.py", "idlelib/idle_test/t.py", "lib2to3/tests/a.py",
                "site-packages/numpy/core.py", "config-3.11-x86_64-linux-gnu/python-config.py",
                "_sysconfigdata__linux_x86_64-linux-gnu.py", "pkg1/notes.txt"):
        _write(root, rel, "SHOULD_NOT_BE_READ = 1\n")
    return root


def test_corpus_files_skip_tests_site_packages_and_build_config(fake_root):
    files = data.corpus_files(fake_root)
    rel = [p.relative_to(fake_root).as_posix() for p in files]
    assert len(rel) == 41
    assert rel == sorted(rel)
    assert not any(part in ("test", "tests", "idle_test", "site-packages") for r in rel for part in r.split("/"))
    assert "_sysconfigdata__linux_x86_64-linux-gnu.py" not in rel and all(r.endswith(".py") for r in rel)


def test_split_is_disjoint_complete_and_deterministic(fake_root, tmp_path):
    train = data.load_corpus("train", root=fake_root, cache_dir=tmp_path / "c1")
    val = data.load_corpus("val", root=fake_root, cache_dir=tmp_path / "c1")
    again = data.load_corpus("train", root=fake_root, cache_dir=tmp_path / "c2")  # fresh cache: re-read
    assert train.dtype == torch.uint8 and train.dim() == 1
    assert torch.equal(train, again)
    stats = data.corpus_stats(fake_root)
    assert len(train) == stats["train_bytes"] and len(val) == stats["val_bytes"]
    assert stats["train_bytes"] + stats["val_bytes"] == stats["bytes"]
    train_text, val_text = bytes(train.tolist()), bytes(val.tolist())
    assert b"SHOULD_NOT_BE_READ" not in train_text + val_text
    in_val = [f"# module {i}\n".encode() in val_text for i in range(40)]
    in_train = [f"# module {i}\n".encode() in train_text for i in range(40)]
    assert all(a != b for a, b in zip(in_val, in_train))  # every module in exactly one split
    assert any(in_val) and any(in_train)


def test_real_stdlib_corpus(tmp_path):
    root = data.stdlib_root()
    files = data.corpus_files()
    rel = [p.relative_to(root).as_posix() for p in files]
    train = {r for r in rel if data.split_of(r) == "train"}
    val = {r for r in rel if data.split_of(r) == "val"}
    assert train and val and not train & val and len(train) + len(val) == len(rel)
    assert 0.03 < len(val) / len(rel) < 0.15  # VAL_PERCENT=8, by hash
    assert "os.py" in rel and not any(r.startswith("test/") or "/tests/" in r for r in rel)
    stats = data.corpus_stats()
    assert stats["files"] == len(rel) and stats["bytes"] > 1_000_000
    val_tokens = data.load_corpus("val", cache_dir=tmp_path)
    assert len(val_tokens) == stats["val_bytes"]
    assert torch.equal(val_tokens, data.load_corpus("val", cache_dir=tmp_path))


def test_second_load_reads_the_cache(fake_root, tmp_path):
    cache = tmp_path / "cache"
    first = data.load_corpus("train", root=fake_root, cache_dir=cache)
    path = data.cache_path("train", root=fake_root, cache_dir=cache)
    assert path.is_file() and path.stat().st_size == len(first)
    assert path.name.startswith("stdlib-train-")
    path.write_bytes(b"#" * len(first))  # same size, different content: only a cache read returns it
    assert bytes(data.load_corpus("train", root=fake_root, cache_dir=cache).tolist()) == b"#" * len(first)
    assert not list(cache.glob("*.tmp"))  # the atomic write leaves no temporary file behind


def test_cache_is_invalidated_when_a_file_changes(fake_root, tmp_path):
    cache = tmp_path / "cache"
    train_file = next(p for p in data.corpus_files(fake_root)
                      if data.split_of(p.relative_to(fake_root).as_posix()) == "train")
    before = data.cache_path("train", root=fake_root, cache_dir=cache)
    data.load_corpus("train", root=fake_root, cache_dir=cache)
    train_file.write_text(train_file.read_text() + "EXTRA = 'new text'\n")
    assert data.cache_path("train", root=fake_root, cache_dir=cache) != before
    assert b"EXTRA = 'new text'" in bytes(data.load_corpus("train", root=fake_root, cache_dir=cache).tolist())


def test_cache_key_includes_python_version(fake_root, tmp_path, monkeypatch):
    before = data.cache_path("train", root=fake_root, cache_dir=tmp_path)
    monkeypatch.setattr(sys, "version", "9.99.0 (imaginary)")
    assert data.cache_path("train", root=fake_root, cache_dir=tmp_path) != before


def test_cache_dir_env_var(monkeypatch, tmp_path):
    monkeypatch.setenv(data.CACHE_ENV_VAR, str(tmp_path / "from-env"))
    assert data.resolve_cache_dir() == tmp_path / "from-env"
    assert data.resolve_cache_dir(tmp_path / "arg") == tmp_path / "arg"


def test_missing_root_names_the_path(tmp_path):
    missing = tmp_path / "no" / "such" / "stdlib"
    with pytest.raises(FileNotFoundError, match=str(missing)):
        data.load_corpus("train", root=missing, cache_dir=tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no .py files"):
        data.corpus_files(tmp_path / "empty")


def test_bad_split_is_rejected(fake_root):
    with pytest.raises(ValueError, match="split='validation'"):
        data.load_corpus("validation", root=fake_root)


def test_get_batch_shapes_and_shift():
    corpus = torch.arange(1000, dtype=torch.int64) % 256
    corpus = corpus.to(torch.uint8)
    g = torch.Generator().manual_seed(0)
    x, y = data.get_batch(corpus, batch_size=5, seq_len=17, generator=g)
    assert x.shape == y.shape == (5, 17)
    assert x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    for row_x, row_y in zip(x, y):  # every row is a real window of the corpus, y one step ahead
        start = int(row_x[0])
        assert torch.equal(row_x, (torch.arange(start, start + 17) % 256))
        assert torch.equal(row_y, (torch.arange(start + 1, start + 18) % 256))
    x2, _ = data.get_batch(corpus, 5, 17, generator=torch.Generator().manual_seed(0))
    assert torch.equal(x, x2)


def test_get_batch_reaches_the_last_token_and_rejects_short_data():
    corpus = torch.arange(9, dtype=torch.uint8)
    _, y = data.get_batch(corpus, batch_size=64, seq_len=8)  # only one window fits
    assert torch.equal(y, torch.arange(1, 9).expand(64, 8))
    with pytest.raises(ValueError, match="seq_len=9"):
        data.get_batch(corpus, batch_size=1, seq_len=9)


def test_encode_decode_round_trip():
    text = "def f(x):\n    return x  # naïve → ok\n"
    tokens = data.encode(text)
    assert tokens.dtype == torch.int64 and int(tokens.max()) < 256
    assert data.decode(tokens) == text
    assert data.decode([0xFF, 0x41]) == "\ufffdA"  # invalid UTF-8 is replaced, never raises
