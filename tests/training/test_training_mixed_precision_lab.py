"""helpers.training.mixed_precision_lab: the sentences on the six training variants follow their numbers."""
from helpers.training import mixed_precision_lab


def _summary(**loss):
    names = ["fp32", "fp16 no scaling", "fp16 + our scaler", "fp16 + GradScaler", "bf16 autocast"]
    zero = {"fp32": 1e-5, "fp16 no scaling": 3e-3, "fp16 + our scaler": 0.0, "fp16 + GradScaler": 0.0,
            "bf16 autocast": 0.0}
    skipped = loss.pop("skipped", 0)
    return {n: {"final_loss": loss.get(n.split()[0].replace("+", ""), 4.046), "zero_grad_fraction": zero[n],
                "skipped_steps": skipped if "+" in n else 0} for n in names}


def test_training_sentences_follow_the_numbers():
    same = mixed_precision_lab.training_sentences(_summary(), 12)
    assert "300× fp32's" in same[0] and "scaling recovered" in same[0]
    assert "does not show the lost gradients" in same[1] and len(same) == 2
    s = _summary(skipped=1)
    for n in ("fp16 + our scaler", "fp16 + GradScaler"):
        s[n]["final_loss"] = 4.131
    text = mixed_precision_lab.training_sentences(s, 12)
    assert "skipped 1 of 12 steps" in text[2] and "skipped updates cost it more than rounding" in text[2]
    s = _summary()
    s["fp16 no scaling"]["final_loss"] = 4.2
    assert "slowed training" in mixed_precision_lab.training_sentences(s, 12)[1]
    s = _summary()
    s["fp16 no scaling"]["zero_grad_fraction"] = 1e-5
    assert "recovered" not in mixed_precision_lab.training_sentences(s, 12)[0]
