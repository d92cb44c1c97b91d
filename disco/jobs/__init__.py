"""The jobs the commands run: compare, collect, profile, and the runners they decode through.

compare, collect, profile; the runners that decode a pair's prompts on disco's loop or an engine's own
(runner); the first-turn answers (answers); a collection's processes (launch); llama-server tuned on an
artifact's prompts (server_tuning).
"""
