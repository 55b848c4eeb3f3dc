"""The `ssh` backend and what belongs to SSH alone: ssh_config, host keys, connections, `ssh-setup`."""
