"""The lowest layer: plain values and the standard library.

defaults, settings (every setting's range), errors, options (PairOptions), files (atomic writes), crash (a
native crash as one line), machine (this CPU, its usable cores), shipped (the shipped data; setup.py reads
it alone).
"""
