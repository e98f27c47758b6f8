import pytest

from helpers.measure import params


def test_bad_profile_names_parameter_and_allowed_values():
    with pytest.raises(ValueError) as err:
        params.resolve_profile("fast")
    msg = str(err.value)
    assert "PROFILE" in msg and "'fast'" in msg
    for allowed in params.PROFILES:
        assert repr(allowed) in msg


def test_auto_profile_is_smoke_without_cuda():
    import torch

    expected = "full" if torch.cuda.is_available() else "smoke"
    assert params.resolve_profile("auto") == expected
    assert params.resolve_profile("full") == "full"


def test_by_profile_and_setup(results_tmp, tmp_path):
    s = params.setup("smoke", seed=3, interactive=False, results_dir=str(tmp_path / "r"))
    assert s.profile == "smoke" and s.seed == 3 and not s.interactive
    assert s.results_dir == tmp_path / "r" and s.results_dir.is_dir()
    assert s.pick(smoke=1, full=2) == 1
    assert params.by_profile("full", smoke=1, full=2) == 2


@pytest.mark.parametrize("kwargs, name", [
    ({"seed": -1}, "SEED"), ({"seed": 1.5}, "SEED"), ({"interactive": "yes"}, "INTERACTIVE"),
    ({"device": "tpu"}, "DEVICE"), ({"profile": "quick"}, "PROFILE")])
def test_setup_rejects_bad_values(results_tmp, kwargs, name):
    with pytest.raises(ValueError, match=name):
        params.setup(**kwargs)


def test_choose_and_positive():
    assert params.choose("X", 2, (1, 2)) == 2
    with pytest.raises(ValueError, match="X=3"):
        params.choose("X", 3, (1, 2))
    assert params.positive("N", 4) == 4
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="N="):
            params.positive("N", bad)
