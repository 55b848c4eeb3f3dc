"""Running a job: the attempt loop, the agents' nodes, and the one loop that waits on them."""
