"""What every notebook measures with, and where it writes what it measured. Imports only `show`.

`hardware`     what the device is: name, capabilities (formats native or emulated, measured on a CPU),
               library versions, datasheet peaks with their sources, and the matmul each format runs as
`ceilings`     what the device does: measured matmul throughput and copy bandwidth, the ceilings
               notebook 00 records for the later notebooks, and the one copy ceiling every GB/s is set against
`clock`        the one CPU clock: the thread's own CPU time with the wall time beside it, the share of
               the wall time the thread ran, and a probe of the machine's contention
`bench`        the one timer on that clock (CUDA events on a GPU): warm-up, median and IQR, interleaved
               comparisons, plausibility bounds
`heap`         freed memory kept in the process (glibc's malloc thresholds), so a CPU timing pays no page
               faults for the tensors it frees and allocates again
`memory`       peak CUDA memory, bytes autograd saves for backward, freeing what a failed step left
`protocol`     the protocol for a headline: warm up until steady, interleaved rounds until the spread
               can rank the variants, ratios with IQR bounds, sentences that rank only separated timings
`results`      records: one JSON file per measurement, written atomically; the headline summaries
`claims`       the one verdict rule and the claims the course tests, for the report's ledger
`params`       notebook parameters: validation, profiles, the one setup call of each notebook
`profiling`    torch.profiler's top ops, Perfetto traces, CUDA memory snapshots
`triton_mode`  whether Triton compiles for the GPU or runs in its interpreter, switched by each
               kernel module for itself
"""
