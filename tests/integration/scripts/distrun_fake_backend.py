"""`distrun` with the test backend `fake` (tests/fake_backend.py) in its table: `--launcher fake -H a,b`
launches agents on this machine that count as remote hosts, so one machine can hold a job of several hosts."""

from launcher.backends import api

api.BACKENDS["fake"] = "tests.fake_backend"

from launcher.entry import main  # noqa: E402 - after the table has the backend

main()
