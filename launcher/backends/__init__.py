"""How agents are started and reached: the Backend interface and registry, links, the fan-out, and one
module or package per backend (local, ssh, srun)."""
