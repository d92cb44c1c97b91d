"""disco: dynamic speculation length for speculative decoding (DISCO, arXiv 2405.04304)."""

__version__ = "0.1.0"
