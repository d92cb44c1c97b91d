"""What disco reads and writes besides artifacts: prompt sets, MT-Bench, traces, plots.

prompts and mtbench (the prompt sets), trace (the oracle traces' schema, writer and reader), plots (compare's
PNGs).
"""
