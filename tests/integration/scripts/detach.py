"""A rank that starts processes leaving its process group every way a program can, records their pids in
PID_DIR, then exits with --code or waits for the stop.

detach.py PID_DIR [--code N] [--wait]
Kinds: start_new_session=True; process_group=0; a double-forked setsid daemon; one that also ignores SIGTERM.
"""

import os
import subprocess
import sys
import time

pid_dir = sys.argv[1]
code = int(sys.argv[sys.argv.index("--code") + 1]) if "--code" in sys.argv else 0
rank = os.environ["RANK"]
SLEEP = [sys.executable, "-c", "import time; time.sleep(300)"]
DEAF = [
    sys.executable,
    "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)",
]


def record(kind: str, pid: int) -> None:
    with open(os.path.join(pid_dir, f"r{rank}-{kind}.pid"), "w") as f:
        f.write(str(pid))


record("session", subprocess.Popen(SLEEP, start_new_session=True).pid)
if sys.version_info >= (3, 11):
    record("group", subprocess.Popen(SLEEP, process_group=0).pid)
else:
    record("group", subprocess.Popen(SLEEP, preexec_fn=os.setpgrp).pid)  # noqa: PLW1509

for kind, argv in (("daemon", SLEEP), ("deaf-daemon", DEAF)):
    # The classic daemon: fork, setsid, fork again; the middle process exits, so the daemon is orphaned.
    # The pipe closes on the daemon's exec: the rank goes on once its pid is recorded (a job that ended
    # before that, on a loaded machine, stopped daemons that no test could know of).
    recorded, written = os.pipe()
    middle = os.fork()
    if middle == 0:
        os.setsid()
        if os.fork() == 0:
            record(kind, os.getpid())
            os.execv(argv[0], argv)
        os._exit(0)
    os.close(written)
    os.waitpid(middle, 0)
    os.read(recorded, 1)
    os.close(recorded)

with open(os.path.join(pid_dir, f"r{rank}.ready"), "w") as f:
    f.write("")
print(f"rank {rank} detached", flush=True)
if "--wait" in sys.argv:
    time.sleep(300)
# Every rank has detached its processes before any rank ends the job (a failing one stops the others).
world = int(os.environ["WORLD_SIZE"])
deadline = time.monotonic() + 60
while sum(name.endswith(".ready") for name in os.listdir(pid_dir)) < world and time.monotonic() < deadline:
    time.sleep(0.02)
sys.exit(code)
