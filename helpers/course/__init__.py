"""The course's own machinery, serving every notebook (00-13): exercises, the headless runner and its
report, the reference capture on a lent GPU, and the GPU performance goals. The top layer: it may import
every other package, and none imports it.

`check`         exercises: the registry, the value / choice / code checkers that never reveal the answer,
                and `python -m helpers.course.check`, which proves each checker on its reference and on
                planted wrong answers
`exercises/`    one module per notebook (`nb00` ... `nb13`) registering that notebook's exercises
`run`           `python -m helpers.course.run`: executes notebooks headlessly with papermill, each in a
                worker process of its own, into a run folder with its summary and report
`worker`        one notebook in a worker process, the supervision of the workers and their kernels
                (signals, stray processes), where an executed notebook stopped, and the run's summary table
`report`        the report of a run (report.md and report.html): claims ledger, this run beside the
                reference GPUs, one section per notebook with its headline numbers and figures
`report_picture` the report's opening, "the course in one picture": notebook 14's training and serving
                ladders, tokens/s per rung beside each reference GPU's, one sentence per ladder
`capture`       `python -m helpers.course.capture`: reference runs on a briefly lent GPU within a time
                budget, packed as they finish, and their import into results/<gpu>/
`gpu_smoke`     `python -m helpers.course.gpu_smoke`: step 0 of a capture, every notebook at smoke sizes on the
                GPU several at once (gpu-smoke.json, failed notebooks packed), and its import
`strip`         `python -m helpers.course.strip`: notebooks without outputs, execution counts or widget state
`goals`         `python -m helpers.course.goals`: the registry of the GPU performance goals (keyed by
                notebook, e.g. `07.scaled_mm`), their H200 estimates, and the runner (one process per
                goal, a time limit each, goals.json after every goal)
`goal_base`     what every goal function shares: its context (`Ctx`), its checks and result, its guards
                (no CUDA, no FP8), and the trained models the goals share
`goals_train`   the goals of notebooks 07 (FP8), 09 (torch.compile), 12 (data loading), 13 (distributed)
`goals_decode`  the goals of notebooks 08 (quantised decode), 10 (KV cache, paged attention, serving)
                and 11 (speculative decoding)
"""
