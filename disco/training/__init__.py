"""`disco train` and the simulator it tunes with.

The trace rows and the split by prompt (train_data), fitting the models (fitting), every rule tuned by
simulated speedup (tuning, simulate), the report (train_report).
"""
