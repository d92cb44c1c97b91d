"""The `disco` command: parsing and early checks, no decoding logic.

Typer signatures (cli), the option groups (cli_options), what each command does once its options are parsed
(commands), the checks that refuse bad options before a model loads (checks), and the demo (demo).
"""
