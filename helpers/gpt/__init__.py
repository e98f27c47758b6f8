"""The course GPT, its corpus, its trained weights and how it generates text: used from notebook 02 on.
Imports `measure` and `show`.

`model`       the GPT (config presets, blocks, attention choices, the cache protocol it decodes with)
`data`        the corpus (the Python standard library's own source, as bytes), its splits and batches
`pretrained`  course GPTs trained once per machine and cached, or loaded from the shipped `weights/`
`checkpoint_file`  a checkpoint on disk: why it cannot be read, the digest that finds damage inside its
              weights, and the lock under which one process trains it
`heldout`     held-out loss per window (the windows `validation_loss` averages) and the noise a loss
              gap must exceed before two models are ranked (used by notebooks 08 and 14)
`footprint`   bytes one decode step reads: stored parameters and buffers, one position row, the cache
              (the one definition notebooks 08, 10, 11 and 14 use)
`generation`  the contiguous key/value cache, prefill, one decode step, a rewound step for timing,
              sampling and the generation loop with or without the cache (taught in notebook 10, used by
              notebooks 08, 10 and 11)
"""
