"""The shared thread-count policy (hiertail_fast._threads) used by both CLIs and the runner."""
import pytest
import torch

from hiertail_fast._threads import (
    SMALL_GRAPH_NODES,
    default_threads,
    keeps_thread_count,
    thread_count_kept,
)


def test_default_threads_rule():
    assert default_threads(SMALL_GRAPH_NODES - 1, None, 7) == 1     # small graph: one thread
    assert default_threads(SMALL_GRAPH_NODES, None, 7) == 7         # large: the starting count
    assert default_threads(10, 3, 7) == 3                           # --threads always wins
    assert default_threads(10 ** 6, 3, 7) == 3


def test_thread_count_kept_on_return_and_on_raise():
    start = torch.get_num_threads()
    other = 1 if start != 1 else 2
    try:
        with thread_count_kept():
            torch.set_num_threads(other)
        assert torch.get_num_threads() == start

        @keeps_thread_count
        def main():
            torch.set_num_threads(other)
            raise KeyError("boom")
        with pytest.raises(KeyError):
            main()
        assert torch.get_num_threads() == start
        assert main.__name__ == "main"                               # functools.wraps
    finally:
        torch.set_num_threads(start)
