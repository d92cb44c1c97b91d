"""The closed loop: offline priors corrected by what the serving process measures.

A running cost table (online_costs), online calibration (online_calibration), the governor (governor), and
the loop that joins them (closed_loop); docs/architecture.md, "Closed loop".
"""
