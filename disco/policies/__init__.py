"""The stopping policies, their rules and registry, one round, and the classifier's artifact.

policy (the protocol and the training-free policies), rules, classifier and batch_policy (scalar and batched),
adaptive_verification, rounds (one round defined once), policy_registry, and the classifier on disk
(artifact, artifact_models, tree_tensors).
"""
