"""How distrun reaches a host's agent: a local pipe or an SSH channel, behind one `Link` interface."""
