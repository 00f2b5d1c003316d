"""The bottom layer: dependency-free helpers every other layer may use (shell quoting, Slurm times, text
tables)."""
