"""The course's own machinery, serving every notebook (00-14): exercises, the headless runner and its
report. The top layer: it may import every other package, and none imports it. The maintainers' reference
capture on a lent GPU and the GPU performance goals are tools/capture/ in the repository (not installed),
which imports this package like any user.

`check`         exercises: the registry, the value / choice / code checkers that never reveal the answer,
                and `python -m helpers.course.check`, which proves each checker on its reference and on
                planted wrong answers
`outputs`       how a learner's output is compared with the reference's (`compare`, `describe`, `how_far`),
                in words that never reveal the expected value
`time_limit`    `TimeLimit`: the seconds one call of a learner's function may take, and how it is stopped
`exercises/`    one module per notebook (`nb00` ... `nb14`) registering that notebook's exercises
`run`           `python -m helpers.course.run`: executes notebooks headlessly with papermill, each in a
                worker process of its own, into a run folder with its summary and report
`worker`        one notebook in a worker process, the supervision of the workers and their kernels
                (signals, stray processes), where an executed notebook stopped, and the run's summary table
`processes`     what every command that starts processes shares: signals (`Stop`), process groups and
                descendants ended, one-line errors for bad command-line values and unwritable folders
`report`        the report of a run (report.md and report.html): claims ledger, this run beside the
                reference GPUs, one section per notebook with its headline numbers and figures
`report_render` the report's blocks written out as report.md and report.html (figures inlined)
`executed_notebook` what the report reads from an executed notebook: its cells numbered as JupyterLab
                numbers them, its figures saved, its title and the figures' captions
`report_picture` the report's opening, "the course in one picture": notebook 14's training and serving
                ladders, tokens/s per rung beside each reference GPU's, one sentence per ladder
`smoke_record`  a reference GPU's smoke-pass record (gpu-smoke.json in results/<gpu>/) as the report reads
                it: its name, its reader, and the report's sentence per notebook
`bootstrap`     the first code cell of every notebook: it installs the course where it is not installed (Colab,
                Kaggle), keeping the platform's torch; the repository's address and the README's Colab links
`site`          `python -m helpers.course.site`: the course as a static website built offline (Sphinx, myst-nb)
                from a run folder: a page per executed notebook, the ledger, your device vs the reference
`site_pages`    the website's pages as Sphinx sources: the notebooks (or their committed source, said so),
                the ledger and the device page cut from the report's blocks, the index
`strip`         `python -m helpers.course.strip`: notebooks without outputs, execution counts or widget state
`on_stage`      the technique on stage: a notebook cell marked `# on stage: helpers.<module>[.<name>]` and
                its twin in helpers/, compared line for line, comments included
"""
