"""The local backend: simulated nodes on one machine, each with its
own view of the host (node_view) entered through one namespace per node (node_tmp)."""
