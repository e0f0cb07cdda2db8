"""Data shipped with dstk: config presets, sbatch and hostfile templates. Not code."""
