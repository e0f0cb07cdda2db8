"""Model families known to dstk: one file per family (dimensions, parameter count, HF module
names, pipeline adapter)."""
