"""helpers.gpt.footprint: the bytes one decode step reads, for plain, half-precision and quantised GPTs."""
import types

import pytest
import torch

from helpers.gpt import footprint
from helpers.gpt.model import GPT, GPTConfig
from helpers.lowbit import quant_linear


def _model(**over) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig.preset("tiny", **over)).eval()


def test_a_plain_gpt_reads_its_parameters_once_and_one_position_row():
    model = _model()
    cfg = model.config
    params = sum(p.numel() for p in model.parameters())  # the tied LM head is the token table, once
    want = 4 * (params - cfg.seq_len * cfg.d_model + cfg.d_model)
    assert footprint.decode_step_bytes(model) == want
    assert footprint.decode_step_bytes(model, cache_bytes=1000) == want + 1000
    assert footprint.decode_step_bytes(model.to(torch.bfloat16)) == want // 2
    untied = _model(tie_embeddings=False)
    assert footprint.decode_step_bytes(untied) == want + 4 * cfg.vocab_size * cfg.d_model
    with pytest.raises(ValueError, match="cache_bytes"):
        footprint.decode_step_bytes(model, cache_bytes=-1)


def test_a_meta_model_is_counted_without_memory():
    with torch.device("meta"):
        model = GPT(GPTConfig.preset("tiny"))
    assert footprint.decode_step_bytes(model) == footprint.decode_step_bytes(_model())


@pytest.mark.parametrize("bits", [8, 4])
def test_quantised_linears_are_counted_as_stored(bits):
    model = _model()
    linears = [m for b in model.blocks for m in b.modules() if isinstance(m, torch.nn.Linear)]
    dense = sum(m.weight.numel() * 4 for m in linears)
    quant_linear.swap_linears(model, lambda lin: quant_linear.WeightOnlyLinear.from_linear(lin, bits, 64))
    stored = sum(m.weight_bytes() for m in model.modules() if isinstance(m, quant_linear.WeightOnlyLinear))
    assert 0 < stored < dense
    assert footprint.decode_step_bytes(model) == footprint.decode_step_bytes(_model()) - dense + stored


def test_a_wrapper_tensor_is_counted_through_its_inner_tensors():
    inner = {"codes": torch.zeros(10, dtype=torch.uint8), "scale": torch.zeros(2, dtype=torch.float32)}
    wrapped = types.SimpleNamespace(__tensor_flatten__=lambda: (list(inner), None), **inner)
    assert footprint.tensor_bytes(wrapped) == 10 + 8
    assert footprint.tensor_bytes(torch.zeros(3, 4, dtype=torch.float16)) == 24


def test_storage_bytes_counts_each_storage_once_and_skips_what_has_none():
    w = torch.zeros(4, 8)  # 128 bytes
    view = w[:2]  # the same storage
    other = torch.zeros(3, dtype=torch.float16)  # 6 bytes
    assert footprint.storage_bytes([w, view, w, None, other, torch.empty(5, device="meta")]) == 128 + 6
    assert footprint.storage_bytes(iter([])) == 0
