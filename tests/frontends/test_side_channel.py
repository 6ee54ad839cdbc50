"""The Cancel button's side channel: ipykernel internals it needs, and saying so once when they are absent.

The real click while a cell waits is tested end to end by tests/frontends/test_kernel.py
(over the kernel's wire protocol) and tests/frontends/test_browser.py (in JupyterLab);
these tests are fast and need no kernel: fakes stand in for the kernel and
the widget, so each path of ``route_clicks_to_side_thread`` runs here.
"""

from __future__ import annotations

import logging
import tomllib
from pathlib import Path

import pytest

from tensorjob_jupyter.frontends.view import side_channel

ROOT = Path(__file__).resolve().parents[2]


class FakeComm:
    """A comm as ipykernel 7.1-7.3 made it: no reply routing."""


class RoutingComm:
    """A comm as ipykernel 7.4 makes it."""

    def _reply_subshell_for(self, data, default):  # pragma: no cover - only its presence matters
        return getattr(self, "_reply_subshell_id", default)


class FakeWidget:
    def __init__(self, comm):
        self.comm = comm


class FakeKernel:
    def __init__(self, subshells: bool = True, fail: bool = False):
        self._supports_kernel_subshells = subshells
        self.created = 0
        kernel = self

        class Manager:
            def _create_subshell(self):
                if fail:
                    raise RuntimeError("no more subshells")
                kernel.created += 1
                return f"subshell-{kernel.created}"

        class Loop:
            def add_callback(self, fn):
                fn()

        class Thread:
            manager = Manager()
            io_loop = Loop()

        self.shell_channel_thread = Thread()


@pytest.fixture
def kernel(monkeypatch):
    """Install a fake kernel; reset the once-only warning and the subshell cache."""
    monkeypatch.setattr(side_channel, "warned", False)
    monkeypatch.setattr(side_channel, "_subshell_ids", {})
    holder = {}
    monkeypatch.setattr(side_channel, "_kernel", lambda: holder.get("kernel"))
    return holder


def warnings_of(caplog):
    return [r for r in caplog.records if r.name == "tensorjob_jupyter.frontends.view" and r.levelno == logging.WARNING]


def test_routing_applies_on_a_kernel_with_subshells_and_reuses_one_subshell(kernel, caplog):
    kernel["kernel"] = fake = FakeKernel()
    first, second = RoutingComm(), RoutingComm()
    with caplog.at_level(logging.WARNING, logger="tensorjob_jupyter.frontends.view"):
        assert side_channel.route_clicks_to_side_thread(FakeWidget(first)) is True
        assert side_channel.route_clicks_to_side_thread(FakeWidget(second)) is True
    assert first._reply_subshell_id == second._reply_subshell_id == "subshell-1"
    assert fake.created == 1
    assert warnings_of(caplog) == []


@pytest.mark.parametrize("case", ["comm without routing", "kernel without subshells", "subshell creation fails",
                                  "widget without a comm"])
def test_when_routing_cannot_apply_it_warns_once_and_says_what_to_do(kernel, caplog, case):
    kernel["kernel"] = FakeKernel(subshells=case != "kernel without subshells", fail=case == "subshell creation fails")
    comm = None if case == "widget without a comm" else (FakeComm() if case == "comm without routing" else RoutingComm())
    with caplog.at_level(logging.WARNING, logger="tensorjob_jupyter.frontends.view"):
        results = [side_channel.route_clicks_to_side_thread(FakeWidget(comm)) for _ in range(3)]
    assert results == [False, False, False]
    (warning,) = warnings_of(caplog)  # once, however many views
    message = warning.getMessage()
    assert "cannot act while its cell waits" in message and "--bg" in message
    assert side_channel.TESTED_IPYKERNEL in message
    if case == "comm without routing":
        assert "has no comm reply routing" in message
    if case == "subshell creation fails":
        assert "no more subshells" in message
    assert comm is None or not hasattr(comm, "_reply_subshell_id")


def test_outside_a_kernel_there_is_nothing_to_route_and_nothing_to_say(kernel, caplog):
    with caplog.at_level(logging.WARNING, logger="tensorjob_jupyter.frontends.view"):
        assert side_channel.route_clicks_to_side_thread(FakeWidget(RoutingComm())) is False
    assert warnings_of(caplog) == []
    assert side_channel.warned is False


def test_the_installed_ipykernel_is_the_tested_one_and_has_the_internals_used():
    import ipykernel
    from ipykernel.comm.comm import BaseComm
    from ipykernel.kernelbase import Kernel
    from ipykernel.subshell_manager import SubshellManager

    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert "ipykernel" + side_channel.TESTED_IPYKERNEL in [p.replace(" ", "") for p in pins]
    low, high = (tuple(int(x) for x in bound.split(".")) for bound in
                 side_channel.TESTED_IPYKERNEL.replace(">=", "").replace("<", "").split(","))
    installed = tuple(int(x) for x in ipykernel.__version__.split(".")[:2])
    assert low <= installed < high, f"ipykernel {ipykernel.__version__} is outside {side_channel.TESTED_IPYKERNEL}"
    assert callable(getattr(BaseComm, "_reply_subshell_for", None))
    assert isinstance(getattr(Kernel, "_supports_kernel_subshells", None), property)
    assert callable(getattr(SubshellManager, "_create_subshell", None))


def test_a_routed_comm_stays_routed_when_the_kernel_sends_on_it(kernel):
    """ipykernel 7.4's publish_msg points a comm at the sender's subshell (None: the main thread) on every
    send; the debug buttons' state is written while the job runs, so their routing must survive that."""
    kernel["kernel"] = FakeKernel()

    class PublishingComm(RoutingComm):
        def publish_msg(self):  # what BaseComm.publish_msg does on the updater thread
            self._reply_subshell_id = None

    comm = PublishingComm()
    assert side_channel.route_clicks_to_side_thread(FakeWidget(comm)) is True
    comm.publish_msg()
    assert comm._reply_subshell_for({}, "main") == "subshell-1"
    other = PublishingComm()
    assert side_channel.route_clicks_to_side_thread(FakeWidget(other)) is True
    assert type(other) is type(comm) and isinstance(other, PublishingComm)
