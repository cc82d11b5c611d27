#!/bin/bash
#SBATCH --job-name=srtr-pools
#SBATCH --nodes=4
#SBATCH --exclusive
#SBATCH --no-kill
#SBATCH --output=/shared/runs/pools-1/logs/sbatch.out
#SBATCH --partition=gpu
#SBATCH --account=proj-1
#SBATCH --time=01:30:00
exec /opt/venv/bin/python3 -m srtr up /home/me/examples/pools.yaml --headless --backend slurm --run-dir /shared/runs/pools-1
