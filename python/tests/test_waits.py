"""Where a training loop waits: ``IterableDataset(waits=True)`` reports per batch what making
it cost, ``granary.WaitMeter`` splits the loop's waits by it (parts adding up to each wait),
across DataLoader workers, with a Prometheus text exposition; ``Stream.waits()`` gives the
reader's own attribution."""

import os

import pytest

import granary

from conftest import run

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("waits")
    src = root / "src"
    for i in range(400):
        p = src / f"c{i % 4}" / f"f{i:04}"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(os.urandom(2000 + (i * 53) % 3000))
    ds = root / "ds"
    assert run("pack", src, "-o", ds, "--chunk-size", "64KiB").returncode == 0
    return str(ds)


PARTS = granary.waits.PARTS


def test_stream_waits_add_up(packed):
    s = granary.Stream(packed, 0, 0, 1, 0, 1)
    n = sum(1 for _ in s)
    w = s.waits()
    assert n == 400 and w["waits"] >= 1
    parts = sum(w[k] for k in ("tier_s", "peers_s", "origin_s", "check_s", "plan_s", "other_s"))
    assert abs(parts - w["waited_s"]) < 1e-6


@pytest.mark.parametrize("workers", [0, 2])
def test_a_wait_meter_splits_each_wait_by_what_made_the_batch(packed, workers, tmp_path):
    ds = granary.IterableDataset(packed, batch_size=16, waits=True, seed=1)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)
    meter = granary.WaitMeter(loader)
    ids = []
    for batch in meter:
        ids.extend(batch["id"].tolist())
        w = batch["waits"]
        assert set(w) >= {"origin_s", "check_s", "python_s", "made_s"}
        assert all(v >= 0 for v in w.values())
    assert sorted(ids) == list(range(400))
    # Two workers make 13 batches each of their 200 samples (the last ones of 8).
    n = 25 if workers == 0 else 26
    assert len(meter.batches) == n
    for b in meter.batches:
        assert abs(sum(b[k] for k in PARTS) - b["wait_s"]) < 1e-9, b
    r = meter.report()
    assert r["batches"] == n and r["wall_s"] >= r["wait_s"] + r["step_s"] * 0.99 - 1e-3
    assert abs(sum(r[k] for k in PARTS) - r["wait_s"]) < 1e-6
    text = meter.prometheus(tmp_path / "granary.prom", labels={"job": "t"})
    assert (tmp_path / "granary.prom").read_text() == text
    assert 'granary_train_wait_seconds{part="origin",job="t"}' in text
    assert f'granary_train_batches{{job="t"}} {n}' in text


def test_batches_without_waits_are_all_handoff(packed):
    ds = granary.IterableDataset(packed, batch_size=50)
    meter = granary.WaitMeter(ds)
    assert sum(1 for _ in meter) == 8
    r = meter.report()
    assert abs(r["handoff_s"] - r["wait_s"]) < 1e-9
    with pytest.raises(ValueError, match="need batch_size"):
        granary.IterableDataset(packed, waits=True)


@pytest.mark.parametrize("workers", [0, 2])
def test_the_meter_agrees_with_what_the_loop_measures(packed, workers, tmp_path):
    # Every moment of the loop is a wait or a step: worker start-up and the final wait for
    # the workers to end are waits; a step is the loop's own time, from a batch's arrival to
    # its next request (2 ms of work here, and whatever else the loop does or is descheduled
    # for meanwhile: measured here as the meter defines it, so that a busy machine delays
    # both alike).
    import time

    ds = granary.IterableDataset(packed, batch_size=16, waits=True, seed=1)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)
    meter = granary.WaitMeter(loader)
    steps, returned = 0.0, None
    t_start = time.perf_counter()
    it = iter(meter)
    while True:
        asked = time.perf_counter()
        if returned is not None:
            steps += asked - returned
        try:
            next(it)
        except StopIteration:
            break
        returned = time.perf_counter()
        time.sleep(0.002)
    wall = time.perf_counter() - t_start
    waited = wall - steps
    r = meter.report()
    assert abs(r["wait_s"] - waited) <= 0.05 * waited + 0.002, (r, waited)
    assert abs(r["step_s"] - steps) <= 0.05 * steps + 0.002, (r, steps)
    assert abs(sum(r[k] for k in PARTS) - r["wait_s"]) < 1e-6
    # Headspace from the step's own time: about 1 / 2 ms, not millions.
    assert 0.8 * r["batches"] / steps <= r["data_free_batches_per_s"] <= r["batches"] / steps * 1.05
    # Reports go where reports may: not over a device or a dataset's files.
    with pytest.raises(ValueError, match="not a regular file"):
        meter.prometheus("/dev/null")
    with pytest.raises(ValueError, match="inside the dataset"):
        meter.prometheus(os.path.join(packed, "waits.prom"))
