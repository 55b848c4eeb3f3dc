"""The `srun` backend: the allocation read from Slurm's environment, one srun step, agents dialing home."""
