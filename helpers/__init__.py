"""Shared machinery of the course "LLM efficiency, measured".

One concept per module: `hardware` (what the device is and can do), `bench` (timing and memory),
`results` (recording measurements), `params` (notebook parameters and profiles), `plots`,
`widgets`, `panels` (instructor panel callbacks), `check` (exercise checkers), `tables`, `roofline`,
`data` (the stdlib corpus), `model` (the course GPT), `flops` (exact FLOP accounting), and `run`
/ `report` (the headless runner and its report).
Modules are imported on demand, so `import helpers` stays cheap.
"""

__version__ = "0.1.0"
