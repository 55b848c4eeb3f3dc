"""Seeing inside a running job: call stacks, stragglers, the control socket."""
