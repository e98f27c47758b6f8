"""tools.capture.goals: the registry of the course's GPU performance goals (keyed by notebook), the runner (own
process per goal, time limits, goals.json after each goal, SIGINT and SIGTERM, one-line errors for bad options) and
its wiring into the GPU capture; goal_base's checks and results; goals_train's FP8 linear goal on a stand-in GPU."""
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import psutil
import pytest
import torch

from tools.capture import capture as C
from tools.capture import goal_base, goals_train
from tools.capture import goals as G
from tools.capture.goal_base import check, result

pytestmark = pytest.mark.tooling

ROOT = Path(__file__).resolve().parents[2]
CUDA_ONLY = ["07.scaled_mm", "07.float8_linear", "09.fused_bandwidth", "09.triton_softmax", "09.reduce_overhead",
             "09.train_step", "10.decode_bandwidth", "10.paged_decode", "08.quantized_decode", "08.compiled_decode",
             "12.pinned"]


def test_every_goal_is_registered_once_under_its_notebook_with_an_estimate():
    keys = {g.key for g in G.GOALS}
    assert keys == set(CUDA_ONLY) | {"10.continuous_batching", "11.speculative", "12.data_wait", "12.packing",
                                     "13.ring", "13.bucketed_ddp", "13.zero_memory"}
    assert sorted(G.ORDER) == sorted(keys) and len(G.ORDER) == len(keys)
    assert {g.notebook for g in G.GOALS} == {f"{n:02d}" for n in range(7, 14)}
    assert all(g.key.startswith(g.notebook + ".") for g in G.GOALS)
    assert all(g.estimate_s > 0 and g.basis and g.title and g.fn.__doc__.startswith(g.key + ":") for g in G.GOALS)
    assert not any(g.fn.__name__.startswith("g") and g.fn.__name__[1:3].isdigit() for g in G.GOALS)
    # about 300 s, what a 540 s call leaves the goals after a smoke pass of about 240 s, apart from the last
    # (08.compiled_decode), which runs where a call gives the goals the whole 540 s (GOALS_BUDGET_S=540)
    assert sum(g.estimate_s for g in G.GOALS if g.key != G.ORDER[-1]) <= 330
    assert sum(g.estimate_s for g in G.GOALS) <= 540
    assert [g.key for g in G.select(["13"])] == ["13.ring", "13.zero_memory", "13.bucketed_ddp"]
    assert G.select(["7"]) == G.select(["07"])  # a notebook number with or without its leading zero
    assert [g.key for g in G.select(["11.speculative", "07"])] == ["07.scaled_mm", "07.float8_linear",
                                                                  "11.speculative"]
    with pytest.raises(ValueError, match="no goal matches"):
        G.select(["21"])


def test_goals_are_named_by_their_notebook_in_the_code_scripts_and_docs():
    """No goal is named by a tracker's number: neither "issue N" nor a key outside notebooks 07-13."""
    paths = [*sorted((ROOT / "tools" / "capture").glob("*.py")), *sorted((ROOT / "helpers" / "course").glob("*.py")),
             *sorted((ROOT / "scripts").glob("*.sh")), ROOT / "results" / "README.md"]
    for path in paths:
        text = path.read_text()
        assert not re.search(r"\bissues?\b", text, flags=re.I), path
        keys = set(re.findall(r"(?<![\w.])(\d\d)\.[a-z][a-z_]+", text))
        assert keys <= {f"{n:02d}" for n in range(14)}, (path, keys)


def test_the_goals_import_nothing_the_lent_gpus_image_lacks():
    """The goals run first on the lent H200, whose image has torch, Triton, numpy and matplotlib but none of
    these (results/README.md): importing the registry, and so every goal module, must not need them."""
    absent = ["ipywidgets", "IPython", "nbformat", "papermill", "torchao", "bitsandbytes", "peft"]
    code = f"import sys, tools.capture.goals; print([m for m in {absent!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_checks_and_results():
    assert check("x", 1.7, ">=", 1.6)["met"] is True
    assert check("x", 1.2, "<=", 1.1)["met"] is False
    missing = check("x", None, ">=", 2.0, "torchao unusable")
    assert missing["met"] is None and missing["reason"] == "torchao unusable"
    with pytest.raises(ValueError):
        check("x", 1.0, "==", 1.0)
    r = result([check("a", 2.0, ">=", 1.0), check("b", 0.5, ">=", 1.0)], {}, {"n": 1})
    assert r["met"] is False and r["headline"] == "b" and r["ratio"] == 0.5  # the failed check is the headline
    r = result([check("a", 2.0, ">=", 1.0), missing], {}, {})
    assert r["met"] is None and r["headline"] == "a"
    assert result([check("a", 2.0, ">=", 1.0)], {}, {})["met"] is True
    rec = {"notebook": "07", "goal": "07.x", "status": "measured", "seconds": 1.0, **r}
    assert "1 of 2 parts not measured: torchao unusable" in G.table({"goals": [rec]})


def _boom(ctx):
    raise RuntimeError("planted failure\nsecond line")


def _quick(ctx):
    return result([check("quick ratio", 3.0, ">=", 2.0)], {"value": 3.0}, {"n": 1})


def _hang(ctx):
    pid = Path(ctx.cache_dir) / "hang.pid"
    pid.write_text(str(os.getpid()))
    time.sleep(600)


def _hang_after_partial(ctx):
    ctx.partial(first_tflops=1.5)
    ctx.partial(second_tflops=2.5, first_tflops=1.25)  # later calls merge, and a repeated name takes the new value
    time.sleep(600)


def _goal(fn, key):
    return G.Goal("99", key, key, fn, 1.0, "test", 1.0)


def test_a_failing_goal_is_recorded_and_the_next_still_runs(tmp_path):
    doc = G.run([_goal(_boom, "99.boom"), _goal(_quick, "99.quick")], tmp_path, profile="smoke", budget_s=120,
                log=lambda s: None)
    boom, quick = doc["goals"]
    assert boom["status"] == "failed" and boom["error"] == "RuntimeError: planted failure" and boom["met"] is None
    assert quick["status"] == "measured" and quick["met"] is True and quick["ratio"] == 3.0
    on_disk = json.loads((tmp_path / "goals.json").read_text())
    assert on_disk["finished"] and [g["goal"] for g in on_disk["goals"]] == ["99.boom", "99.quick"]
    assert "99.boom" in G.table(on_disk) and "planted failure" in G.table(on_disk)


def test_a_goal_over_its_limit_is_stopped_with_its_process(tmp_path):
    doc = G.run([_goal(_hang, "99.hang"), _goal(_quick, "99.quick")], tmp_path, profile="smoke", budget_s=120,
                limit=lambda goal, profile: 8.0, log=lambda s: None)
    hang, quick = doc["goals"]
    assert hang["status"] == "stopped" and "time limit" in hang["reason"]
    assert quick["status"] == "measured"
    pid = int((tmp_path / "cache" / "hang.pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_the_budget_skips_a_goal_whose_estimate_does_not_fit(tmp_path):
    big = G.Goal("99", "99.big", "big", _quick, 1.0, "test", 500.0)
    doc = G.run([big], tmp_path, profile="smoke", budget_s=60, log=lambda s: None)
    assert doc["goals"][0]["status"] == "skipped" and "500 s" in doc["goals"][0]["reason"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU answer")
def test_cuda_only_goals_are_not_measurable_on_a_cpu_in_one_sentence(tmp_path):
    doc = G.run(G.select(CUDA_ONLY), tmp_path, profile="smoke", budget_s=300, log=lambda s: None)
    assert [g["goal"] for g in doc["goals"]] == [k for k in G.ORDER if k in CUDA_ONLY]
    for g in doc["goals"]:
        assert g["status"] == "not measurable", g
        assert "CUDA" in g["reason"] and "Traceback" not in g["reason"] and "\n" not in g["reason"]


def test_a_smoke_run_of_a_cheap_subset_writes_goals_json(tmp_path, capsys):
    assert G.main(["run", "--out", str(tmp_path), "--profile", "smoke", "--budget-s", "200", "11.speculative"]) == 0
    doc = json.loads((tmp_path / "goals.json").read_text())
    assert {"started", "profile", "budget_s", "machine", "planned", "goals", "finished", "seconds"} <= set(doc)
    (g,) = doc["goals"]
    assert g["status"] == "measured", g
    assert {"notebook", "goal", "title", "measured", "ratio", "target", "met", "checks", "sizes", "seconds",
            "estimate_s", "device"} <= set(g)
    assert g["notebook"] == "11" and g["sizes"]["gammas"] == [1, 2] and isinstance(g["met"], bool)
    assert len(g["checks"]) == 2 * 2 + 2 and all({"what", "value", "target", "met"} <= set(c) for c in g["checks"])
    assert list((tmp_path / "cache" / "pretrained").glob("*.pt"))  # the trained models' shared cache
    out = capsys.readouterr().out
    assert "11.speculative" in out and "notebook" in out and "met" in out
    assert G.main(["plan"]) == 0 and "total" in capsys.readouterr().out
    assert G.main(["run", "--out", str(tmp_path), "21"]) == 2


def test_the_capture_brings_goals_json_back_and_imports_it(tmp_path):
    assert C.MAX_PACKS + 4 <= 8  # packs + gpu.txt, capture.log, goals.json, smoke.tgz: the device tool's 8 files
    script = (ROOT / "scripts" / "gpu_capture.sh").read_text()
    assert "tools.capture.goals run" in script and "GOALS_BUDGET_S" in script and "goals.json" in script
    out = tmp_path / "out"
    out.mkdir()

    def runner(nb, work, profile, limit_s, log=print):
        (work / "results").mkdir(parents=True)
        (work / "results" / f"rec{nb}.json").write_text(json.dumps({"name": f"rec{nb}", "device": "NVIDIA H200"}))
        return "ok", ""
    C.capture(["00"], out, 1e6, runner=runner, log=lambda s: None, work=tmp_path / "work", estimates={})
    goals = {"goals": [{"notebook": "07", "goal": "07.scaled_mm", "status": "measured", "ratio": 1.7}],
             "machine": {"gpu": "NVIDIA H200"}}
    (out / "goals.json").write_text(json.dumps(goals))
    assert C.main(["import", str(out / "capture-1.tgz"), "--into", str(tmp_path / "results")]) == 0
    got = json.loads((tmp_path / "results" / "nvidia-h200" / "goals.json").read_text())
    assert got["goals"][0]["ratio"] == 1.7
    with tarfile.open(out / "capture-1.tgz") as tar:
        assert "00/results/rec00.json" in tar.getnames()
    only = tmp_path / "only"  # goals alone, when no notebook finished
    only.mkdir()
    (only / "goals.json").write_text(json.dumps(goals))
    assert C.main(["import", str(only / "goals.json"), "--into", str(tmp_path / "r2")]) == 0
    assert (tmp_path / "r2" / "nvidia-h200" / "goals.json").is_file()
    (only / "goals.json").write_text("{}")
    assert C.main(["import", str(only / "goals.json"), "--into", str(tmp_path / "r3")]) == 1


def test_a_capture_that_skips_notebooks_for_its_budget_exits_0():
    out = lambda *st: [C.Outcome(f"0{i}", x) for i, x in enumerate(st)]  # noqa: E731
    assert C.exit_status(out("ok", "skipped")) == 0  # the goals took part of the budget: later calls take the rest
    assert C.exit_status(out("ok", "failed")) == 1 and C.exit_status(out("stopped", "ok")) == 1


def test_float8_linear_says_when_our_rowwise_ran_emulated(monkeypatch, tmp_path):
    """Where torch._scaled_mm refuses rowwise scales, fp8_linear.scaled_mm falls back to fp32 emulation: the goal
    must not report that emulation's speed as the FP8 linear's (no CUDA needed: the callees are replaced)."""
    from helpers.lowbit import fp8_linear, fp8_train_lab

    monkeypatch.setattr(goals_train, "need_fp8", lambda: None)
    monkeypatch.setattr(fp8_train_lab, "linear_tflops", lambda n, variant, reps, compile=False, device="cuda":
                        {"bf16": 400.0, "ours rowwise": 100.0, "torchao rowwise": 500.0}[variant])
    monkeypatch.setattr(fp8_linear, "torchao_problem", lambda recipe, device="cpu": None)
    ctx = goal_base.Ctx("full", tmp_path, "cuda")
    monkeypatch.setattr(fp8_linear, "scaled_mm_refusal", lambda device, rowwise=True: None)
    r = goals_train.float8_linear_speedup(ctx)
    assert r["met"] is False and r["ratio"] == 0.25 and r["checks"][1]["value"] == 0.2
    monkeypatch.setattr(fp8_linear, "scaled_mm_refusal", lambda device, rowwise=True: "rowwise scales unsupported")
    r = goals_train.float8_linear_speedup(ctx)
    assert r["met"] is None and all(c["met"] is None and "emulation" in c["reason"] for c in r["checks"])
    assert r["measured"]["ours_rowwise_emulated"] == "rowwise scales unsupported"


def test_goals_that_time_what_a_notebook_times_take_its_full_profile_sizes(monkeypatch, tmp_path):
    """09's whole-model compiles and softmax row lengths, 10's compiled decode step and batching mix and 13's
    DDP rows are those notebooks' full-profile sizes (no CUDA: the callees are replaced and keep what they
    were given)."""
    from tools.capture import goals_decode
    from helpers.decode import kv_cache_lab, kv_decode_lab, serving_lab
    from helpers.fusion import compiler_lab
    from helpers.gpt.model import GPT, GPTConfig
    from helpers.measure import params
    from helpers.parallel import collectives_lab, launch

    full, setup = goal_base.Ctx("full", tmp_path, "cuda"), params.Setup("full", "cpu", 0, False, None)
    nb09 = compiler_lab.resolve_parameters(setup, **dict.fromkeys(
        ["ROWS", "COLS", "DTYPE", "REPS", "SOFTMAX_COLS", "MODEL", "N_LAYER", "BATCH", "SEQ_LEN", "MODES",
         "REGIONAL_LAYERS", "REGIONAL_BACKEND"]))
    nb13 = collectives_lab.resolve_parameters(setup, **dict.fromkeys(
        ["WORLD_SIZE", "MEMORY_RANKS", "MSG_SIZES", "REPS", "DDP_WIDTH", "DDP_ROWS", "MICROS", "STAGE_MS",
         "MEMORY_MODEL", "TORCHRUN"]))
    tiny = GPT(GPTConfig.preset("tiny"))
    given = {}

    def keep(name, value, result_):
        given[name] = value
        return result_

    preset, cfg = goals_train._gpt_config(full)
    assert (preset, cfg.n_layer, cfg.seq_len) == (nb09["MODEL"], nb09["N_LAYER"], nb09["SEQ_LEN"]) == ("small10m", 3, 256)
    monkeypatch.setattr(goals_train, "need_cuda", lambda why: None)
    monkeypatch.setattr(goals_train.triton_softmax, "BROKEN", None)
    monkeypatch.setattr(compiler_lab, "softmax_sweep", lambda cols, rows, **kw: keep("softmax", cols, {
        "cols": cols, **{k: [1.0] * len(cols) for k in ("eager", "compiled", "library", "triton")}}))
    goals_train.triton_softmax_speedup(full)
    assert given["softmax"] == nb09["SOFTMAX_COLS"]

    monkeypatch.setattr(goals_decode, "need_cuda", lambda why: None)
    monkeypatch.setattr(goals_decode, "copy_gbps", lambda ctx: 4000.0)
    monkeypatch.setattr(kv_decode_lab, "random_model", lambda preset, dtype, device, **kw: keep("decode", (preset, kw), tiny))
    monkeypatch.setattr(kv_decode_lab, "compiled_decode", lambda model, context, reps: {
        "compiled_gbps": 3000.0, "eager_gbps": 300.0, "compiled_s": 1e-3, "eager_s": 1e-2})
    r = goals_decode.decode_bandwidth(full)
    assert given["decode"] == ("1.3b", {"n_layer": kv_cache_lab.COMPILE_LAYERS_DEFAULT}) and r["sizes"]["n_layer"] == 8
    assert r["ratio"] == 0.75 and r["met"] is True

    monkeypatch.setattr(goals_decode, "trained", lambda ctx, preset, **kw: type("Trained", (), {"model": tiny}))
    monkeypatch.setattr(serving_lab, "compare_policies", lambda model, **kw: keep("batching", kw, {
        "speedup": 2.5, "speedup_range": (2.2, 2.8), "separated": True,
        "record": {"static_tokens_per_s": 1.0, "continuous_tokens_per_s": 2.5, "same_tokens": 48, "num_blocks": 64,
                   "block_size": 16}}))
    r = goals_decode.continuous_batching_speedup(full)
    assert {k: given["batching"][k] for k in ("n_requests", "max_batch", "repeats")} == {
        "n_requests": 48, "max_batch": 32, "repeats": 5}
    nb10 = _cell_with(ROOT / "notebooks" / "10_kv_cache_inference.ipynb", "serving_lab.compare_policies(")
    assert all(text in nb10 for text in ("n_requests=S.pick(smoke=12, full=48)", "max_batch=S.pick(smoke=8, full=32)",
                                         "repeats=BATCH_REPEATS"))  # the notebook's full profile, as the goal takes it
    assert "BATCH_REPEATS = 5 " in _cell_with(ROOT / "notebooks" / "10_kv_cache_inference.ipynb", "BATCH_REPEATS = ")
    assert r["measured"]["speedup_range"] == [2.2, 2.8] and r["measured"]["separated"] is True

    monkeypatch.setattr(launch, "run_on_ranks", lambda fn, world, width, depth, rows, reps, bucket_mb: keep(
        "ddp", (width, rows, reps), [{"comm": 0.05, **{n: {"compute only": 0.01 * n, "after backward": 0.1,
                                                           "overlapped": 0.08, "bucketed": 0.08, "iqr": 0.01}
                                                       for n in rows}}]))
    r = goals_train.bucketed_ddp_speedup(full)
    assert given["ddp"] == (nb13["DDP_WIDTH"], nb13["DDP_ROWS"], nb13["REPS"])
    assert "DDP_DEPTH = S.pick(smoke=4, full=8)" in _cell_with(ROOT / "notebooks" / "13_distributed.ipynb",
                                                               "DDP_DEPTH = ")  # the goal's full depth, 8


def _cell_with(path: Path, text: str) -> str:
    """The source of the first code cell of notebook `path` that contains `text`."""
    cells = json.loads(path.read_text())["cells"]
    return next(src for c in cells if c["cell_type"] == "code" and text in (src := "".join(c["source"])))
    assert r["measured"]["near_row"] == 16 and r["ratio"] == 1.25


def test_a_stopped_goal_keeps_what_it_measured_before_its_limit(tmp_path):
    doc = G.run([_goal(_hang_after_partial, "99.partial"), _goal(_quick, "99.quick")], tmp_path, profile="smoke",
                budget_s=120, limit=lambda goal, profile: 8.0, log=lambda s: None)
    stopped, quick = doc["goals"]
    assert stopped["status"] == "stopped" and stopped["partial"] == {"first_tflops": 1.25, "second_tflops": 2.5}
    assert "partial" not in quick  # a goal that finished reports its result, not its partial numbers
    assert "measured before that: first_tflops 1.25, second_tflops 2.5" in G.table(doc)
    assert goal_base.Ctx("smoke", tmp_path).partial(x=1) is None  # outside the runner: nothing kept, nothing raised


SIGNAL_GOALS = '''
import json, os, subprocess, sys, time
from pathlib import Path

from tools.capture.goal_base import check, result
from tools.capture.goals import Goal


def quick(ctx):
    return result([check("quick ratio", 3.0, ">=", 2.0)], {"value": 3.0}, {"n": 1})


def hang(ctx):
    ctx.partial(first_tflops=1.5)
    ignore = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    a = subprocess.Popen([sys.executable, "-c", ignore])  # in the goal's session, deaf to SIGTERM
    b = subprocess.Popen([sys.executable, "-c", ignore], start_new_session=True)  # one that left it
    ctx.partial(second_tflops=2.5)
    time.sleep(1)
    Path(ctx.cache_dir, "hang.pids").write_text(json.dumps([os.getpid(), a.pid, b.pid]))
    time.sleep(600)


def after(ctx):
    Path(ctx.cache_dir, "after.ran").write_text("ran")
    return quick(ctx)


GOALS = [Goal("99", "99.quick", "quick", quick, 1.0, "test", 1.0), Goal("99", "99.hang", "hang", hang, 1.0, "test", 1.0),
         Goal("99", "99.after", "after", after, 1.0, "test", 1.0)]
'''

DRIVER = '''
import sys
import signal_goals
from tools.capture import goals as G
for g in signal_goals.GOALS:
    G.GOALS.append(g)
    G.BY_KEY[g.key] = g
    G.ORDER.append(g.key)
sys.exit(G.main(["run", "--out", sys.argv[1], "--profile", "smoke", "--budget-s", "300", "99.quick", "99.hang",
                 "99.after"]))
'''


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_the_running_goal_and_all_it_started_and_keeps_its_partial_numbers(tmp_path, sig):
    (tmp_path / "signal_goals.py").write_text(SIGNAL_GOALS)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    main = subprocess.Popen([sys.executable, "-c", DRIVER, str(out)], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    pids = out / "cache" / "hang.pids"
    below, started = [], []
    try:
        deadline = time.monotonic() + 180
        while not pids.exists() and main.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert pids.exists(), "the hanging goal never started"
        below = psutil.Process(main.pid).children(recursive=True)  # forkserver, goal, its children
        started = [psutil.Process(p) for p in json.loads(pids.read_text())]
        main.send_signal(sig)  # to the command alone, as a supervisor or Ctrl-C's handler would
        text, _ = main.communicate(timeout=90)
        alive = psutil.wait_procs(below + started, timeout=10)[1]
    finally:  # whatever happened above, nothing this test started stays
        if main.poll() is None:
            main.kill()
            main.wait()
        for p in below + started:
            try:
                p.kill()
            except psutil.Error:
                pass
    assert main.returncode == 128 + sig, text
    assert {p.pid for p in started} <= {p.pid for p in below}
    assert not alive, f"outlived the command: {alive}"
    assert "Traceback" not in text and f"{signal.Signals(sig).name} received" in text
    doc = json.loads((out / "goals.json").read_text())
    quick, hang, after = doc["goals"]
    assert quick["status"] == "measured" and quick["met"] is True
    assert hang["status"] == "interrupted" and signal.Signals(sig).name in hang["reason"]
    assert hang["partial"] == {"first_tflops": 1.5, "second_tflops": 2.5}
    assert after["status"] == "not run" and not (out / "cache" / "after.ran").exists()
    assert doc["interrupted"] == signal.Signals(sig).name and doc["finished"] is False
    assert "interrupted" in text and "measured before that: first_tflops 1.5" in text  # the table of what finished


@pytest.mark.parametrize("budget", ["nan", "inf", "0", "-10", "lots"])
def test_a_bad_budget_is_one_line_before_anything_runs(tmp_path, capsys, budget):
    with pytest.raises(SystemExit) as exit_:
        G.main(["run", "--out", str(tmp_path / "out"), "--budget-s", budget, "12.pinned"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "--budget-s" in err and budget in err, err
    assert G.main(["run", "--out", str(tmp_path / "out"), "--budget-s", "3", "12.pinned"]) == 2
    assert "must exceed" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("option", ["--out", "--cache-dir"])
def test_an_unwritable_out_or_cache_dir_is_one_line(tmp_path, capsys, option):
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # a folder under a regular file cannot be made, even by root
    folders = {"--out": tmp_path / "out", "--cache-dir": tmp_path / "cache"} | {option: blocker / "sub"}
    code = G.main(["run", "--out", str(folders["--out"]), "--cache-dir", str(folders["--cache-dir"]), "12.pinned"])
    captured = capsys.readouterr()
    assert code == 2 and captured.err.count("\n") == 1 and option in captured.err and str(blocker) in captured.err
    assert "Traceback" not in captured.err + captured.out and not (tmp_path / "out" / "goals.json").exists()


def _goals_doc(started, goals, planned=None):
    return {"started": started, "machine": {"gpu": "NVIDIA H200"}, "planned": planned or [g["goal"] for g in goals],
            "goals": goals}


def _planted_goal(key, status, ratio=None, met=None, reason=""):
    return {"notebook": key[:2], "goal": key, "status": status, "ratio": ratio, "met": met, "target": ">= 1.5",
            "headline": "a / b", "reason": reason}


def test_a_later_goals_run_merges_over_the_earlier_and_the_readme_keeps_both_tables(tmp_path):
    # a first run failed two goals and skipped one on its budget; a second, after a fix, measured the failed ones and
    # skipped the one the first had measured: every goal keeps its latest started outcome, the replaced one under
    # "earlier", and the README holds the smoke table and the goals table, each once, whatever the order of imports
    from tools.capture import capture, goals_record

    first = _goals_doc("2026-12-04T13:16:00+00:00", [_planted_goal("07.scaled_mm", "measured", 1.88, True),
                                                     _planted_goal("09.train_step", "failed", reason="ValueError: clock"),
                                                     _planted_goal("11.speculative", "skipped", reason="budget")])
    second = _goals_doc("2026-12-04T13:28:00+00:00", [_planted_goal("09.train_step", "measured", 1.27, False),
                                                      _planted_goal("07.scaled_mm", "skipped", reason="budget"),
                                                      _planted_goal("11.speculative", "stopped", reason="time limit")])
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "goals.json").write_text(json.dumps(first))
    (tmp_path / "b" / "goals.json").write_text(json.dumps(second))
    target = tmp_path / "results" / "nvidia-h200"
    target.mkdir(parents=True)
    (target / "README.md").write_text(f"# Reference: NVIDIA H200\n\nthe capture's part\n\n{capture.SMOKE_MARK}\n"
                                      "## The smoke pass on this GPU\n\nsmoke table\n")
    assert capture.main(["import", str(tmp_path / "a" / "goals.json"), str(tmp_path / "b" / "goals.json"),
                         "--into", str(tmp_path / "results")]) == 0
    doc = json.loads((target / "goals.json").read_text())
    by = {g["goal"]: g for g in doc["goals"]}
    assert [g["goal"] for g in doc["goals"]] == ["09.train_step", "07.scaled_mm", "11.speculative"]
    assert by["07.scaled_mm"]["status"] == "measured" and by["07.scaled_mm"]["run_started"] == first["started"]
    assert by["09.train_step"]["ratio"] == 1.27 and by["09.train_step"]["earlier"]["status"] == "failed"
    assert by["11.speculative"]["status"] == "stopped" and by["11.speculative"]["earlier"]["status"] == "skipped"
    assert doc["runs"] == [first["started"], second["started"]]
    readme = (target / "README.md").read_text()
    assert readme.startswith("# Reference: NVIDIA H200\n\nthe capture's part") and "smoke table" in readme
    assert readme.count(capture.GOALS_MARK) == 1 and readme.index(capture.SMOKE_MARK) < readme.index(capture.GOALS_MARK)
    assert "in 2 run(s): 2 of 3 measured, 1 met" in readme and "1.88 (a / b)" in readme
    assert "stopped: time limit" in readme
    # a smoke import after the goals rewrites its own table and keeps the goals'
    capture.set_section(target / "README.md", capture.SMOKE_MARK, f"{capture.SMOKE_MARK}\nnew smoke table\n", "# x")
    again = (target / "README.md").read_text()
    assert "new smoke table" in again and "smoke table\n" not in again.replace("new smoke table\n", "")
    assert again.count(capture.GOALS_MARK) == 1 and "1.88 (a / b)" in again
    assert capture.kept_sections(target / "README.md").count(capture.SMOKE_MARK) == 1
    assert goals_record.merge_goals(None, second)["runs"] == [second["started"]]


def test_a_torn_or_foreign_record_is_replaced_not_merged(tmp_path):
    from tools.capture import capture, goals_record

    target = tmp_path / "results" / "nvidia-h200"
    target.mkdir(parents=True)
    run = _goals_doc("2026-12-04T13:28:00+00:00", [_planted_goal("12.pinned", "measured", 3.3, True)])
    (tmp_path / "goals.json").write_text(json.dumps(run))
    for torn in ("{torn", json.dumps({"goals": "not a list"}), json.dumps(["a list"])):
        (target / "goals.json").write_text(torn)
        assert capture.earlier_record(target / "goals.json", "goals", list) is None
        goals_record.import_goals(tmp_path / "goals.json", tmp_path / "results")
        doc = json.loads((target / "goals.json").read_text())
        assert [g["goal"] for g in doc["goals"]] == ["12.pinned"] and "earlier" not in doc["goals"][0]
        assert doc["runs"] == [run["started"]]
    assert capture.earlier_record(target / "absent.json", "goals", list) is None
    assert capture.earlier_record(target / "goals.json", "goals", list)["goals"][0]["ratio"] == 3.3
