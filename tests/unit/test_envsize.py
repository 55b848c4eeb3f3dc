"""One environment string's limit (issue 31, item 5) against the real kernel, and what travels of a shell's
environment: names that are not identifiers do (item 7), a variable no process can be given does not."""

from __future__ import annotations

import errno
import subprocess

import pytest

from launcher.core.envsize import MAX_ARG_STRLEN, check_size, over_limit
from launcher.core.forward import forwarded, job_env
from launcher.errors import UsageError


@pytest.mark.parametrize("extra", [0, 1])
def test_the_limit_is_the_kernels(extra: int) -> None:
    value = "x" * (MAX_ARG_STRLEN - len("V=") - 1 + extra)  # "V=" + value + NUL: the limit, then one more
    try:
        subprocess.run(["true"], env={"V": value}, check=True)
        started = True
    except OSError as err:
        assert err.errno == errno.E2BIG
        started = False
    assert started is not over_limit("V", value)
    assert over_limit("V", value) is bool(extra)


def test_a_value_over_the_limit_is_one_line_naming_where_and_the_variable() -> None:
    with pytest.raises(UsageError) as caught:
        check_size("BIG", "x" * 200_000, "-x")
    assert str(caught.value) == (
        "-x BIG: is 200004 bytes as BIG=VALUE, over the kernel's limit of 131071 for one environment "
        "variable (MAX_ARG_STRLEN); pass so large a value in a file"
    )


def test_names_that_are_not_identifiers_travel_and_a_variable_too_large_does_not() -> None:
    shell = {"GRÜSS": "hallo", "my.var": "1", "X-Y": "2", "BIG": "x" * 200_000, "BASH_FUNC_ml%%": "() { :; }"}
    assert forwarded(shell) == {"GRÜSS": "hallo", "my.var": "1", "X-Y": "2"}
    jenv = job_env(shell, forward=True, env_file=(), exports=())
    assert "BIG" in jenv.unset, "a local rank, which inherits the agent's environment, goes without it too"
