"""The SLURM backend: the allocation, srun steps, grow jobs, and the
pure command lines and parsers of every SLURM command it runs."""
