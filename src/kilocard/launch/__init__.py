"""Launching: run directories, local torchrun, Slurm batch scripts."""
