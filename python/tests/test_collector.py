"""memplan_torch.collector: an export's bookkeeping runs with Python's collector paused, its training steps with the
collector as the caller had it (issue 15: full passes over the exporter's own records made it superlinear)."""

import gc

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from memplan_torch import collector, export


@pytest.fixture
def collector_state():
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


@pytest.mark.parametrize("enabled", [True, False])
def test_paused_and_as_before_restore_the_callers_state(collector_state, enabled):
    (gc.enable if enabled else gc.disable)()
    frozen = gc.get_freeze_count()
    with collector.paused():
        assert not gc.isenabled()
        assert gc.get_freeze_count() > frozen  # what was tracked before the pause is frozen
        with collector.as_before():
            assert gc.isenabled() == enabled
            with pytest.raises(ValueError):
                with collector.paused():  # nested: off, and back to the step's state after an error
                    assert not gc.isenabled()
                    raise ValueError("x")
            assert gc.isenabled() == enabled
        assert not gc.isenabled()
    assert gc.isenabled() == enabled
    assert gc.get_freeze_count() == frozen
    with collector.as_before():  # outside an export: nothing changes
        assert gc.isenabled() == enabled


class _Cycle:
    pass


class CycleNet(nn.Module):
    """Puts a (batch, 77) tensor in a reference cycle in its forward and drops it: only the cyclic collector can
    free it, and the 3,000 lists made next start a collection of the youngest generation, which finds it."""

    def __init__(self):
        super().__init__()
        self.l1, self.l2 = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x):
        h = F.relu(self.l1(x))
        c = _Cycle()
        c.me, c.t = c, torch.empty(x.shape[0], 77, device=x.device)
        del c
        junk = [[] for _ in range(3000)]
        del junk
        return self.l2(h)


def _freed_in(doc):
    """The phase of the event that frees the (batch, 77) storage, or None if the steady step never frees it."""
    sid = next(a["id"] for e in doc["events"] for a in e["alloc"] if a["shape"][1:] == [77])
    return next((e["phase"] for e in doc["events"] if sid in e["free"]), None)


def test_a_cycle_in_the_step_dies_where_the_collector_finds_it(tmp_path, collector_state):
    torch.manual_seed(0)
    m, x, y = CycleNet(), torch.randn(4, 8), torch.randint(0, 4, (4,))
    gc.enable()
    doc = export(m, x, str(tmp_path / "on.json"), loss_fn=F.cross_entropy, targets=y, device="meta")
    assert _freed_in(doc) == "forward"  # the step ran with the collector on, inside the export's pause
    gc.disable()  # the caller's choice holds in the step: the cycle outlives the step
    doc = export(m, x, str(tmp_path / "off.json"), loss_fn=F.cross_entropy, targets=y, device="meta")
    assert _freed_in(doc) != "forward"
    assert not gc.isenabled()
