"""Defined once for every layer above: features, run statistics, the cost model, load profiles.

features (of a draft step), stats (what a generation counted), cost (CostModel), load_profiles (the cost
rules' measured profiles, per machine and proposer).
"""
