"""The course's exercises, one module per notebook (`nb00.py` ... `nb06.py`).

Each module registers its exercises with `helpers.course.check.register`: the expected value or the
reference implementation, the cases a learner's function is called on, the tolerance, a hint that
does not contain the answer, and at least one planted wrong answer that CI checks is refused.
Notebooks only ever call `check.exercise("NN.key", answer)`, so no expected value appears in them.
"""
