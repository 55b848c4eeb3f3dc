"""Pure planning: options as one value, hosts, the plan, each rank's environment and devices, the start
requests."""
