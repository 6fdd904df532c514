"""The packed weight formats' names and the default interleave, importable without torch: the
command builds its parser from them, so --help and a bad flag are answered before torch loads.
formats.py registers the formats under these names (a test keeps the two equal) and takes its
default interleave from here."""

WEIGHT_FORMAT_NAMES = ("bf16", "fp8_block128", "nvfp4")
DEFAULT_INTERLEAVE = 128
