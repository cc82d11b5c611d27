"""srtr: run multi-service jobs on whole nodes of a SLURM allocation, Kubernetes-style.

The package root imports no subpackage, so `import srtr` stays cheap.
"""

__version__ = "0.1.0"
