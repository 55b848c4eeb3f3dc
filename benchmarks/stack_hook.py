"""What the stack hook costs a rank: interpreter start-up with and without it, side by side.

Every rank distrun starts imports the hook that `distrun stacks` reads Python ranks with
(launcher.agent.stackdump):
`python -c pass` and `python -c "import torch"` with the rank's environment, then with the hook's added.

python benchmarks/stack_hook.py [--repeat 15]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from common import REPO, env_with_repo, interleaved

sys.path.insert(0, str(REPO))
from launcher.agent.stackdump import DumpDir


def start(code: str, env: dict[str, str]) -> float:
    began = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    dump_dir = DumpDir()
    try:
        plain = env_with_repo()
        hooked = {**plain, **dump_dir.rank_env(plain)}
        for code in ("pass", "import torch"):
            times = interleaved(
                {"plain": lambda c=code: start(c, plain), "hook": lambda c=code: start(c, hooked)},
                args.repeat,
            )
            ratio = times["hook"] / times["plain"]
            plain_ms, hook_ms = times["plain"] * 1000, times["hook"] * 1000
            print(
                f"python -c {code!r}: {plain_ms:.1f} ms plain, {hook_ms:.1f} ms with the stack hook "
                f"({ratio:.3f}x, {hook_ms - plain_ms:+.1f} ms)"
            )
    finally:
        dump_dir.remove()


if __name__ == "__main__":
    main()
