"""helpers.dataload.loading_takeaways_lab: notebook 12's closing sentences carry the numbers given."""
from types import SimpleNamespace

from helpers.dataload import loading_takeaways_lab


def _row(idle, wait_ms=0.5, text="1,000 tokens/s"):
    return SimpleNamespace(idle=idle, wait=SimpleNamespace(ms=wait_ms), tokens_per_s_text=lambda: text)


def _inputs(**over):
    sweep = {"w=0": _row((0.4, 0.3, 0.5)), "w=2": _row((0.01, 0.0, 0.02)), "memmap": _row((0.0, 0.0, 0.0), 0.04, "9,000 tokens/s")}
    kw = dict(sweep=sweep, fewest="w=0", most="w=2", cuda=False, withheld=None, wait_sentence="waits shorter",
              loader_sentence="w=2 faster", contention="main thread ran 95%", compute_range=None,
              persist_sentence=None, epochs=2, memory_mb={"python": 12.0, "numpy": 0.05},
              packed={"padded": {"padding": 0.5, "rows": 32, "saved_mb": 8.0},
                      "packed": {"padding": 0.012, "rows": 16, "saved_mb": 4.0}},
              pack_sentence="packed 1.4x", mask_err=4.8e-7, leak_after=0.063, flex_err=1.1e-6,
              mask_bytes={"block_mask": 21760, "dense": 20971520, "row_len": 2048},
              shards={False: {"repeated": 4, "missing": 0}, True: {"repeated": 0, "missing": 3}}, n_docs=3000, ranks=7,
              shuffled=0.99, h2d=None, pin_claim={"verdict": "not testable"}, overlap=None)
    kw.update(over)
    return kw


def test_the_sentences_carry_the_numbers_given():
    lines = loading_takeaways_lab.takeaways(**_inputs())
    assert len(lines) == 6 and all(line.startswith("- ") for line in lines)
    assert lines[0].startswith("- Data wait: waits shorter. ") and "waited 0.04 ms per step" in lines[0]
    assert lines[0].endswith("The main thread ran 95%.")
    assert "numpy store fixes copy-on-access" in lines[1]
    assert "50.0% of the padded batch" in lines[2] and "(16 rows instead of 32)" in lines[2]
    assert "off by up to 0.063 nats" in lines[3] and "storing 21,760 bytes against the dense mask's 20,971,520" in lines[3]
    assert "read 4 documents twice" in lines[4] and "skipped 3" in lines[4]
    assert lines[5] == "- Pinned memory: not measured (no GPU in this run)."


def test_optional_parts_appear_only_when_measured():
    lines = loading_takeaways_lab.takeaways(**_inputs(
        persist_sentence="persistent faster", compute_range=(10.0, 20.0), memory_mb={"python": 1.0, "numpy": 0.9},
        h2d=[{"bytes": 2 ** 28, "pinned_speedup": (2.0, 1.8, 2.2)}], pin_claim={"verdict": "supported"},
        overlap={"hidden": 0.8}))
    assert len(lines) == 7 and "varied 2.0x" in lines[0]
    assert lines[1] == "- Persistent workers, 2 short epochs: persistent faster."
    assert "no clear difference" in lines[2]
    assert "Pinned copies of 256 MB: 2.00x" in lines[-1] and "hid 80%" in lines[-1]
