"""The pipeline (`pipeline_step` by GPipe and 1F1B) against `torch.distributed.pipelining` on the module zoo of
tests/parallel_support.py (one start of 2 gloo ranks), its refusals, the schedules, GPipe's bubble formula
and the replay of a schedule with given times."""
import re

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from helpers.parallel import launch
from helpers.parallel import pipeline as PP
from parallel_support import SEED, ZOO, build, io_batches, refused, same_as_torch, sgd, snapshot

MICRO = 2


# ---------------------------------------------------------------- on ranks

def _stage(kind, rank):
    return build(kind, SEED + rank)  # stage r: the zoo module with its own weights


def ours_pipeline(kind, rank, world, schedule):
    stage = _stage(kind, rank)
    opt = sgd(stage.parameters())
    losses = []
    for x, t in io_batches(world):
        opt.zero_grad()
        losses.append(PP.pipeline_step(stage, schedule, MICRO, inputs=x if rank == 0 else None,
                                       targets=t if rank == world - 1 else None, loss_fn=F.mse_loss))
        opt.step()
    return {**snapshot(stage.named_parameters()), "losses": losses}


def torch_pipeline(kind, rank, world, schedule):
    from torch.distributed import pipelining  # optional: not in every torch build

    stage = _stage(kind, rank)
    cls = {"gpipe": pipelining.ScheduleGPipe, "1f1b": pipelining.Schedule1F1B}[schedule]
    run = cls(pipelining.PipelineStage(stage, rank, world, torch.device("cpu")), n_microbatches=MICRO,
              loss_fn=F.mse_loss)
    opt = sgd(stage.parameters())
    losses = []
    for x, t in io_batches(world):
        opt.zero_grad()
        if rank == 0:
            run.step(x)
            losses.append(None)
        else:
            got = []
            run.step(target=t, losses=got)
            losses.append([float(v) for v in got])
        opt.step()
    return {**snapshot(stage.named_parameters()), "losses": losses}


SCHEDULES = ("gpipe", "1f1b")


def _misc(rank, world) -> dict:
    out = {}
    stage = _stage("plain", rank)
    x = torch.randn(4, 3, 8)
    out["uneven"] = refused(lambda: PP.pipeline_step(stage, "gpipe", 3, inputs=x, targets=x, loss_fn=F.mse_loss))
    # rank 0 lacks inputs, rank 1 a loss_fn: both refuse before sending anything
    out["no loss_fn"] = refused(lambda: PP.pipeline_step(stage, "gpipe", 2, targets=x))
    return out


def pipeline_matrix(rank: int, world: int) -> dict:
    """Every (schedule, zoo module) pair against torch's pipelining, and the pipeline's own refusals."""
    out = {}
    for kind in ZOO:
        for schedule in SCHEDULES:
            cell = out[f"{schedule}|{kind}"] = {"ours": refused(lambda: ours_pipeline(kind, rank, world, schedule))}
            if "refused" not in cell["ours"]:  # torch's run is the reference for ours, nothing to compare otherwise
                cell["torch"] = refused(lambda: torch_pipeline(kind, rank, world, schedule))
            dist.barrier()
    out["misc"] = _misc(rank, world)
    dist.barrier()
    return out


# ---------------------------------------------------------------- the tests

@pytest.fixture(scope="module")
def ranks():
    return launch.run_on_ranks(pipeline_matrix, 2, timeout=240)


@pytest.mark.ranks
@pytest.mark.parametrize("kind", list(ZOO))
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_pipeline_agrees_with_torch(ranks, schedule, kind):
    for r in ranks:
        same_as_torch(r[f"{schedule}|{kind}"]["ours"], r[f"{schedule}|{kind}"]["torch"])


@pytest.mark.ranks
def test_pipeline_refuses_what_it_cannot_split(ranks):
    for rank, r in enumerate(ranks):
        name = "inputs" if rank == 0 else "targets"
        assert re.match(rf"ValueError: pipeline_step: rank {rank} needs {name}, a tensor whose dim 0 splits into "
                        r"micro=3 equal micro-batches; got 4 rows", r["misc"]["uneven"]["refused"])
    assert re.match(r"ValueError: pipeline_step: rank 0 needs inputs, .*; got None", ranks[0]["misc"]["no loss_fn"]["refused"])
    assert re.match(r"ValueError: pipeline_step: the last rank \(1\) needs loss_fn", ranks[1]["misc"]["no loss_fn"]["refused"])


# ---------------------------------------------------------------- without ranks

def test_a_stage_output_that_cannot_travel_is_refused():
    y = torch.ones(2, 3)
    with pytest.raises(ValueError, match="a stage must return one floating tensor of at most 8 dims for the next "
                                         "stage, got a tuple"):
        PP.send_activation((y, y), 1, [])
    with pytest.raises(ValueError, match="got a torch.int64 tensor of 2 dims"):
        PP.send_activation(y.long(), 1, [])


def test_pipeline_schedules_and_bubble_formula():
    for kind in ("gpipe", "1f1b"):
        sched = PP.pipeline_schedule(kind, 4, 6)
        for s, steps in enumerate(sched):
            assert sorted(steps) == sorted([("F", i) for i in range(6)] + [("B", i) for i in range(6)])
            assert all(steps.index(("F", i)) < steps.index(("B", i)) for i in range(6))
            held, peak = 0, 0
            for op, _ in steps:
                held += 1 if op == "F" else -1
                peak = max(peak, held)
            assert peak == (6 if kind == "gpipe" else 4 - s)
    assert PP.bubble_formula(4, 8) == pytest.approx(3 / 11)
    with pytest.raises(ValueError):
        PP.pipeline_schedule("zigzag", 2, 2)
    with pytest.raises(ValueError, match="stages=0 must be a positive int"):
        PP.pipeline_schedule("gpipe", 0, 2)
    with pytest.raises(ValueError, match="micro=1.0 must be a positive int"):
        PP.pipeline_schedule("1f1b", 2, 1.0)


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(2, 1), (2, 8), (3, 5), (4, 8)])
def test_replay_gives_the_formula_with_free_messages_and_more_with_delays(kind, p, m):
    assert PP.replay_schedule(kind, p, m, 0.01, 0.02)["bubble"] == pytest.approx(PP.bubble_formula(p, m))
    assert PP.replay_schedule(kind, p, m, 0.01, 0.02, delay_s=1e-3)["bubble"] > PP.bubble_formula(p, m)
    r = PP.replay_schedule(kind, p, m, 0.01, 0.02, overhead_s=1e-3)
    assert r["busy_s"] == [pytest.approx(m * 0.03)] * p and r["bubble"] > PP.bubble_formula(p, m)


def test_replay_refuses_negative_times():
    with pytest.raises(ValueError, match="delay_s=-1"):
        PP.replay_schedule("gpipe", 2, 2, 0.01, 0.02, delay_s=-1)


def test_bubble_exercise_accepts_two_digits(capsys):
    from helpers.course import check

    check.exercise("13.bubble", 0.23)
    assert "PASS" in capsys.readouterr().out
