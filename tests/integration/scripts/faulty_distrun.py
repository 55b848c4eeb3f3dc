"""distrun with a fault injected into one of its diagnosis tools (issue 38): FAULT DISTRUN_ARGS...

The fault makes that tool raise RuntimeError("injected") wherever the job calls it; the job must run on.
FAULT: `verdict` (grouping's verdict), `top` (the live view: samples and `distrun top`'s answer),
`stragglers` (the straggler watch, fed by every line of output).
"""

import runpy
import sys


def injected(*_: object, **__: object) -> None:
    raise RuntimeError("injected")


fault = sys.argv[1]
if fault == "verdict":
    from launcher.diagnose import stacks

    stacks.verdict = injected  # type: ignore[assignment]
elif fault == "top":
    from launcher.diagnose.live import LiveView

    LiveView.answer = injected  # type: ignore[method-assign,assignment]
    LiveView.on_samples = injected  # type: ignore[method-assign]
elif fault == "stragglers":
    from launcher.diagnose.stragglers import StragglerWatch

    StragglerWatch.seen = injected  # type: ignore[method-assign]
else:
    sys.exit(f"faulty_distrun.py: no fault {fault!r}")
sys.argv = ["distrun", *sys.argv[2:]]
runpy.run_module("launcher", run_name="__main__")
