"""helpers.gpt.pretrained: checkpoints are cached per recipe and retrained when torn or of another recipe, the
shipped weights load on any corpus and are copied into the cache, and the shipped smoke models are committed."""
from __future__ import annotations

import pytest
import torch

from helpers.gpt import pretrained


def test_pretrained_caches_and_retrains(tmp_path, capsys):
    kw = dict(cache_dir=tmp_path, device="cpu", progress=False, n_layer=1, d_model=32, d_ff=64, n_head=2)
    first = pretrained.pretrained("tiny", 3, **kw)
    assert first.trained_now and first.path.is_file()
    assert first.perplexity == pytest.approx(torch.tensor(first.val_loss).exp().item())
    second = pretrained.pretrained("tiny", 3, **kw)
    assert not second.trained_now
    for a, b in zip(first.model.state_dict().values(), second.model.state_dict().values()):
        assert torch.equal(a, b)
    assert pretrained.pretrained("tiny", 4, **kw).path != first.path  # steps are part of the key
    first.path.write_bytes(b"torn")
    capsys.readouterr()
    third = pretrained.pretrained("tiny", 3, **kw)
    assert third.trained_now and "could not be read" in capsys.readouterr().out
    payload = torch.load(first.path, weights_only=True)
    payload["key"]["format"] = -1
    torch.save(payload, first.path)
    assert pretrained.pretrained("tiny", 3, **kw).trained_now
    assert "another configuration" in capsys.readouterr().out
    with pytest.raises(ValueError, match="steps"):
        pretrained.pretrained("tiny", 0, **kw)
    with pytest.raises(ValueError, match="preset"):
        pretrained.pretrained("nope", 3, **kw)


def test_shipped_weights_load_on_any_corpus_and_are_copied_into_the_cache(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(pretrained, "SHIPPED_DIR", tmp_path / "shipped")
    monkeypatch.setitem(pretrained.SCHEDULES, "tiny", dict(steps=3, batch=2, seq_len=16, lr=1e-3))
    small = dict(n_layer=1, d_model=32, d_ff=64, n_head=2)
    kw = dict(device="cpu", progress=False, **small)
    path = pretrained.ship("tiny", progress=False, **small)
    shipped = torch.load(path, weights_only=True)
    assert path.parent == tmp_path / "shipped" and "corpus" not in shipped["key"] and shipped["trained_on"]
    capsys.readouterr()
    got = pretrained.pretrained("tiny", cache_dir=tmp_path / "cache", **kw)
    assert not got.trained_now and "shipped with the course" in capsys.readouterr().out
    assert got.path.is_file() and got.path.is_relative_to(tmp_path / "cache")
    for name, value in shipped["state_dict"].items():
        assert torch.equal(value, got.model.state_dict()[name])
    assert not pretrained.pretrained("tiny", cache_dir=tmp_path / "cache", **kw).trained_now  # now from the cache
    assert "loaded" in capsys.readouterr().out
    real = pretrained.checkpoint_key  # another machine: the same recipe, another corpus key
    monkeypatch.setattr(pretrained, "checkpoint_key", lambda *a: {**real(*a), "corpus": "stdlib-train-elsewhere"})
    assert not pretrained.pretrained("tiny", cache_dir=tmp_path / "other", **kw).trained_now
    assert pretrained.pretrained("tiny", 4, cache_dir=tmp_path / "other", **kw).trained_now  # another recipe: not shipped


def test_the_shipped_smoke_models_are_in_the_repository():
    for preset, overrides in pretrained.SHIP:
        config = pretrained.GPTConfig.preset(preset, **overrides)
        sched = pretrained.schedule_for(preset, None, config)
        assert pretrained.shipped_path(pretrained.checkpoint_key(config, sched, 0)).is_file(), (preset, overrides)
