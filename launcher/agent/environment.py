"""A rank's environment, composed on its host: the one place that sees both the host's environment and what
the launcher sends (`StartRequest.env`, `RankSpec.env` and `RankSpec.defaults`).

Apart from `protocol` because the wire says what travels and this says how it lands: the host's environment
less `unset`, then what travels to every rank, then the rank's own variables, then each default only where
the name is still unset (launcher.core.env.rank_env makes the contract and the defaults).

Stdlib-only and Python 3.7 compatible: it is shipped to remote hosts with the agent.
"""

from __future__ import annotations

from collections.abc import Mapping

from launcher.agent.protocol import RankSpec, StartRequest


def start_environment(host_env: Mapping[str, str], start: StartRequest) -> dict[str, str]:
    """What every rank of a start shares: the host's environment less `unset` (and `unset_prefixes`), then
    the request's `env` over it."""
    prefixes = tuple(start.unset_prefixes)
    unset = set(start.unset)
    env = {k: v for k, v in host_env.items() if k not in unset and not k.startswith(prefixes)}
    env.update(start.env)
    return env


def rank_environment(shared: Mapping[str, str], rank: RankSpec) -> dict[str, str]:
    """One rank's environment over `start_environment`'s: its own variables, then its defaults where unset.

    The one place where "default unless set" is decided (see launcher.core.env.rank_env).
    """
    env = dict(shared)
    env.update(rank.env)
    for name, value in rank.defaults.items():
        env.setdefault(name, value)
    return env
