"""Shared machinery of the course "LLM efficiency, measured".

One concept per module. Shared machinery: `hardware` (what the device is and can do), `bench`
(timing and memory), `results` (recording measurements), `params` (notebook parameters and
profiles), `plots`, `widgets`, `panels` (instructor panel callbacks of 00 and 01), `check`
(the exercise mechanism; each notebook's exercises in `exercises/nbNN.py`), `claims` (verdicts on
the claims the course tests), `profiling` (torch.profiler tables, traces, memory snapshots),
`tables`, `strip` (notebooks as committed), `run` / `run_worker` / `report` (the headless runner
and its report) and `capture` (reference runs on a lent GPU). The course GPT and its corpus:
`model`, `data`. One module per technique: `roofline`, `flops`, `mfu`, `precision`,
`mixed_precision`, `checkpointing`, `accumulation`, `attention`, `flash_triton`, `fp8`, `loading`
and `packing` (data loading and sequence packing).
Modules are imported on demand, so `import helpers` stays cheap.
"""

__version__ = "0.1.0"
