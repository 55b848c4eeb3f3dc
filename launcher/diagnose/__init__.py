"""Seeing inside a running job: call stacks and stragglers."""
