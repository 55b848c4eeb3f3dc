"""The per-host agent: everything in this package, and nothing else, is shipped to every host as source.

Stdlib only: its modules import nothing but the standard library and `launcher.agent` (a unit test holds them
to that), and run on OLDEST_PYTHON, the oldest Python that README says a host needs. This file itself is not
shipped (the bootstrap makes the package on the host): the launcher's side reads it."""

OLDEST_PYTHON = (3, 7)
