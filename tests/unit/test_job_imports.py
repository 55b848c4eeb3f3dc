"""launcher/job/ has no import circle (every import counts, `if TYPE_CHECKING:` ones included): the host watch
knows the running attempt only through what it asks of it (launcher.job.host_watch.Attached) and an
attempt's hosts through launcher.job.attempt_hosts, never through the Job or the Supervisor."""

from __future__ import annotations

from tests.layering import REPO, imported_names, module_name, modules


def _graph() -> dict[str, set[str]]:
    paths = modules("launcher/job")
    names = {module_name(path) for path in paths}
    return {
        module_name(path): {name for _, name in imported_names(path) if name in names} - {module_name(path)}
        for path in paths
    }


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle, as the modules along it, or None."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_launcher_job_has_no_import_circle() -> None:
    graph = _graph()
    assert graph["launcher.job.host_watch"].isdisjoint({"launcher.job.run", "launcher.job.supervise"})
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_circle_finder_finds_one() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert REPO.is_dir()
