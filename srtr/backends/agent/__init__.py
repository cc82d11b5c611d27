"""The node agent (the kubelet of srtr) and the backend that drives it.

One agent process runs on each node and owns that node's instances: it starts them with
`procgroup.ProcessGroups`, signals and reaps them, runs their readiness probes and reports
what happens over one TCP connection to the controller. The modules:

- `protocol.py`: the messages, their encoding (newline-delimited JSON) and the token proofs;
  pure.
- `node.py`: the agent process (`python -m srtr.backends.agent.node`); it imports nothing of
  the controller side.
- `channel.py`: the controller's end of the connections (accept, authenticate, heartbeats).
- `starters.py`: how the agents are started: one process per simulated node (local) or one
  srun step for the whole allocation (SLURM).
- `backend.py`: `AgentBackend`, the `Backend` the controllers see.

docs/agents.md describes the design and the channel's security.
"""
