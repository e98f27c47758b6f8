"""How the notebooks print and draw: the bottom layer, used by every notebook and imported by every
other package (it imports none of them).

`tables`   plain-text tables for printed results
`plots`    the course's figure style and its common charts (bars, lines, rooflines)
`units`    percentages, byte counts and durations in words, one format each
`widgets`  ipywidgets panels that also run headless, and the progress bar (silent in headless runs)
"""
