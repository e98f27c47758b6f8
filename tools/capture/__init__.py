"""The reference capture on a briefly lent GPU and the GPU performance goals: maintainers' tooling, not
installed, run from the repository root (`python -m tools.capture.<module> ...`); `scripts/gpu_capture.sh`
runs them in one device call. Built on `helpers` (the course runner, `helpers.course.worker`'s process
supervision, `helpers.measure.results`), which never imports this package.

`capture`       `python -m tools.capture.capture`: reference runs of the notebooks on a lent GPU within a
                time budget, packed as they finish, and their import into results/<gpu>/
`gpu_smoke`     `python -m tools.capture.gpu_smoke`: step 0 of a capture, every notebook at smoke sizes on
                the GPU several at once (gpu-smoke.json, failed notebooks packed), and its import (the
                record's readers are `helpers.course.smoke_record`, which the report uses)
`goals`         `python -m tools.capture.goals`: the registry of the GPU performance goals (keyed by
                notebook, e.g. `07.scaled_mm`), their H200 estimates, and the runner (one process per
                goal, a time limit each, goals.json after every goal)
`goals_record`  a GPU's goals kept beside its references: goals.json merged run over run (a goal a later
                run did not start keeps its earlier outcome) and its table in the folder's README.md
`goal_base`     what every goal function shares: its context (`Ctx`), its checks and result, its guards
                (no CUDA, no FP8), and the trained models the goals share
`goals_train`   the goals of notebooks 07 (FP8), 09 (torch.compile), 12 (data loading), 13 (distributed)
`goals_decode`  the goals of notebooks 08 (quantised decode), 10 (KV cache, paged attention, serving)
                and 11 (speculative decoding)
`gpu_check`     `python -m tools.capture.gpu_check`: the GPU check of notebook 06's Triton FlashAttention,
                its correctness and speed against SDPA's kernels in one short run, recorded as JSON
"""
