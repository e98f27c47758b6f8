"""Shared machinery of the course "LLM efficiency, measured".

One concept per module. Shared machinery: `hardware` (what the device is and can do), `bench`
(timing and memory), `results` (recording measurements), `params` (notebook parameters and
profiles), `plots`, `widgets`, `panels` (instructor panel callbacks of 00 and 01), `check`
(exercise checkers), `tables`, and `run` / `report` (the headless runner and its report). The
course GPT and its corpus: `model`, `data`. One module per technique: `roofline`, `flops`, `mfu`,
`precision`, `mixed_precision`, `checkpointing`, `accumulation`, `attention`, `flash_triton`.
Modules are imported on demand, so `import helpers` stays cheap.
"""

__version__ = "0.1.0"
