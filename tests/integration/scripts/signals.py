"""A rank that shows which signals reach it: SIGUSR1/SIGUSR2 print and go on (or exit 0), Ctrl-C cleans up.

signals.py PID_DIR [--exit-on-usr1] [--ignore-int] [--wait-for FILE] (exit 0 once FILE exists)
"""

import os
import signal
import sys
import time

rank = os.environ["RANK"]
pid_dir = sys.argv[1]
exit_on_usr1 = "--exit-on-usr1" in sys.argv
wait_for = sys.argv[sys.argv.index("--wait-for") + 1] if "--wait-for" in sys.argv else None


def on_user_signal(signum: int, _frame: object) -> None:
    print(f"rank {rank} got {signal.Signals(signum).name}", flush=True)
    if exit_on_usr1 and signum == signal.SIGUSR1:
        sys.exit(0)


if "--ignore-int" in sys.argv:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGUSR1, on_user_signal)
signal.signal(signal.SIGUSR2, on_user_signal)
signal.signal(signal.SIGTERM, lambda *_: (print(f"rank {rank} got SIGTERM", flush=True), sys.exit(143)))
with open(os.path.join(pid_dir, f"rank{rank}.pid"), "w") as f:
    f.write(str(os.getpid()))
try:
    print(f"rank {rank} ready", flush=True)
    for _ in range(600):
        if wait_for and os.path.exists(wait_for):
            sys.exit(0)
        time.sleep(0.1)
except KeyboardInterrupt:
    print(f"rank {rank} cleaning up after KeyboardInterrupt", flush=True)
    sys.exit(130)
