"""What talks to other hosts but is no backend: the job's TLS certificate and
pinning, git refs of `source.rev`, a fleet's member list and a pool's published count."""
