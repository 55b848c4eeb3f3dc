"""The per-host agent: everything in this package, and nothing else, is shipped to every host as source.

Stdlib only: its modules import nothing but the standard library and `launcher.agent` (a unit test holds them
to that), and run on the oldest Python that README says a host needs."""
