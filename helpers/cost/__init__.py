"""What compute costs: the hardware's ceilings, arithmetic intensity, FLOP counts and MFU (notebooks 00, 01 and 02).

`roofline`      the ops of a transformer at one size n: their counted FLOPs and minimum bytes, runnable
                closures, the roofline min(P, W·I) and which side of the ridge an intensity lies (01)
`flops`         exact FLOP accounting of the course GPT in FlopCounterMode's convention, FlopCounterMode's
                own count of a model, 6ND, the PaLM per-token formula, MFU and training days (02, 04, 05)
`mfu`           the count grouped as notebook 02 compares it (a blog post's formulas, one block's halves,
                6N's error), byte models of a block's parts, GPU-hours and implied MFU (02)
`hardware_lab`  notebook 00's matmul panel and the sentences generated from its ceiling sweeps (00)
`roofline_lab`  notebook 01's timing of the ops, the roofline panel and the verdict sentences (01)
`mfu_lab`       notebook 02's timed training steps and sub-blocks, the FLOPs panel, figures and
                verdict sentences (02)
"""
