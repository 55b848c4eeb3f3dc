"""The host runtime: the one `Loop` and its `Phase`s, the agents' `Node`s and each attempt's `HostAttempt`,
connecting, the probe, the start-up watch and the control socket. Orchestration (`launcher.job`), the workdir
sync, `check` and `diagnose` build on it."""
