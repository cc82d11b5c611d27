"""The node agent (the kubelet of srtr) and the backend that drives it.

One agent process runs on each node and owns that node's instances: it starts them with
`procgroup.ProcessGroups`, signals and reaps them, runs their readiness probes and reports
what happens over one TCP connection to the controller. The modules:

- `protocol.py`: the messages, their encoding (newline-delimited JSON) and the token proofs;
  pure.
- `frames.py`: what an agent sends on its connection besides TLS records, between them:
  tagged heartbeat frames and the doorbell after a message; pure.
- `node.py`: the agent process (`python -m srtr.backends.agent.node`), with its lease in
  `lease.py`, its dialling in `dial.py` and its instances' environment in `node_env.py`; none
  imports anything of the controller side.
- `channel.py`: the controller's end of the connections (accept, authenticate, heartbeats),
  one descriptor per agent (`FDS_PER_AGENT`); what wakes the loop for a socket in
  `coalesced.py`, which sockets had heartbeats arrive in `beats.py`.
- `starters.py`: how the agents are started: one process per simulated node (local) or one
  srun step for the whole allocation (SLURM); hollow mode's in `hollow_starter.py`, what
  every starter is in `starter_base.py`.
- `backend.py`: `AgentBackend`, the `Backend` the controllers see; its adoption of a crashed
  controller's agents in `adoption.py`, nodes joining later in `growth.py`, its records in
  `roster.py`, and `AgentProber` in `probing.py`.

docs/agents.md describes the design and the channel's security.
"""
