"""helpers.decode.prefill: shared-prefix generation equal to the unshared cache (identical tokens, bitwise
logits, the blocks and copies counted), and chunked prefill equal to a plain prefill, leaving the other requests'
tokens alone."""
from __future__ import annotations

import pytest
import torch

from helpers.decode import paged, prefill
from kv_support import small_gpt


@pytest.mark.slow
@pytest.mark.parametrize("prompt_len,block", [(13, 4), (12, 4)])
def test_shared_prefix_generation_equals_unshared_and_saves_the_formulas_blocks(prompt_len, block):
    model = small_gpt(2)
    prompt = list(range(3, 3 + prompt_len))
    suffixes = [[1, 2], [5, 6], [9, 10]]
    sh = prefill.shared_prefix_generate(model, prompt, suffixes, 5, block_size=block, share=True)
    un = prefill.shared_prefix_generate(model, prompt, suffixes, 5, block_size=block, share=False)
    assert sh.tokens == un.tokens and torch.equal(sh.logits, un.logits)
    unshared = 3 * paged.blocks_for(prompt_len + 2 + 5, block)  # three requests of prompt + 2 + 5 tokens
    copies = 2 if prompt_len % block else 0  # the prompt's partly filled last block, for all but its last writer
    assert (sh.physical, un.physical, sh.cow_copies, un.cow_copies) == (
        unshared - 2 * (prompt_len // block), unshared, copies, 0)
    assert sh.logical == un.physical
    with pytest.raises(ValueError):
        prefill.shared_prefix_generate(model, prompt, [[1], [2, 3]], 5)


@pytest.mark.slow
def test_chunked_prefill_equals_plain_prefill_and_leaves_other_requests_alone():
    model = small_gpt(2)
    prompt = list(range(5, 35))
    others = [[3, 4, 5], [6, 7]]
    plain, o_plain = prefill.chunked_prefill(model, prompt, len(prompt), others=others, decode_steps=6)
    chunked, o_chunked = prefill.chunked_prefill(model, prompt, 7, others=others, decode_steps=6)
    ref = model(torch.tensor([prompt]))[0][0]
    torch.testing.assert_close(plain, ref, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(chunked, plain, rtol=1e-5, atol=1e-4)
    assert o_chunked == o_plain and all(len(o) == 6 for o in o_plain)
    alone = [prefill.chunked_prefill(model, o, len(o), decode_steps=6)[0].argmax(-1)[-1].item() for o in others]
    assert [o[0] for o in o_plain] == alone  # the first token comes from each request's own prefill
    with pytest.raises(ValueError, match="decode_steps"):
        prefill.chunked_prefill(model, prompt, 7, others=others, decode_steps=2)
