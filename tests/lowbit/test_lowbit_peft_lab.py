"""helpers.lowbit.peft_lab: our LoRA and QLoRA against Hugging Face's peft."""
from __future__ import annotations

import pytest

from helpers.lowbit import gptq, lora, peft_lab


@pytest.fixture(scope="module")
def need_peft():
    why = peft_lab.peft_missing()
    if why:
        pytest.skip(why)


@pytest.mark.slow
@pytest.mark.parametrize("base,cls", [("fp32", "Linear"), ("nf4", "Linear4bit")])
def test_lora_and_qlora_equal_peft_bitwise(tiny, need_peft, base, cls):
    p = peft_lab.peft_parity(tiny, r=4, alpha=8, base=base)
    assert p["layers"] == len(gptq.block_linears(tiny)) and p["peft_class"] == cls
    assert p["bitwise"], p  # the same ops in the same order on a CPU in fp32


def test_peft_parity_catches_a_wrong_merge(tiny, need_peft, monkeypatch):
    delta = lora.LoRALinear.delta
    monkeypatch.setattr(lora.LoRALinear, "delta", lambda self: 1.01 * delta(self))  # a planted 1% error
    p = peft_lab.peft_parity(tiny, r=4, alpha=8)
    assert p["logits"] == 0 and p["grad_A"] == 0  # the forward does not use delta()
    assert p["merged"] > 0 and not p["bitwise"]


@pytest.mark.slow
def test_peft_initialises_like_ours(tiny, need_peft):
    res = peft_lab.parity(tiny, r=4)
    out = " ".join(peft_lab.parity_sentences(res))
    assert res["version"] and out.count("bitwise equal") == 2 and "Kaiming-uniform with a = √5" in out
    got = res["init"]
    for who in ("ours", "peft"):
        assert got[who]["B_zero"]
        assert 0.9 < got[who]["A_max_over_bound"] <= 1.0  # uniform on ±1/√in: Kaiming-uniform with a = √5
        assert 0.9 < got[who]["A_std_over_uniform"] < 1.1


def test_parity_sentences_say_when_peft_differs():
    same = {c: 0.0 for c in peft_lab.PARITY_KEYS}
    init = {"B_zero": True, "A_max_over_bound": 0.99, "A_std_over_uniform": 1.0}
    res = {"lora": {**same, "bitwise": True, "within": True},
           "qlora": {**same, "merged": 0.5, "bitwise": False, "within": False},
           "init": {"ours": init, "peft": {**init, "B_zero": False}}}
    lora_s, qlora_s, init_s = peft_lab.parity_sentences(res)
    assert "are bitwise equal" in lora_s
    assert "NOT within the tolerance of 1e-05 max abs (largest difference 5.0e-01)" in qlora_s
    assert "B is zero in NOT both" in init_s and init_s.endswith("NOT the same kind of draw.")


def test_without_peft_one_sentence_says_so(tiny, monkeypatch):
    def missing():
        raise ImportError("No module named 'peft'")

    monkeypatch.setattr(peft_lab, "_import_peft", missing)
    out = peft_lab.peft_missing()
    assert out.startswith("peft is not installed") and len(out.splitlines()) == 1
    with pytest.raises(ImportError):
        peft_lab.parity(tiny, r=4)
    with pytest.raises(ValueError, match="base"):
        peft_lab.peft_parity(tiny, base="int4")

    def broken():
        raise RuntimeError("torchao built for another torch")

    monkeypatch.setattr(peft_lab, "_import_peft", broken)
    assert peft_lab.peft_missing().startswith("peft is installed but its import failed (RuntimeError")
