"""Tiers shared between nodes from Python: two `granary serve` processes on 127.0.0.1 stand in
for two nodes; the native Stream and IterableDataset read through them with ``peers=``."""

import os
import subprocess

import pytest

import granary
from conftest import granary_bin


SECRET = "python-test-secret-0123456789abcdef"


@pytest.fixture
def nodes(packed, tmp_path):
    path, _ = packed
    procs, addrs, tiers = [], [], []
    for i in range(2):
        tier = tmp_path / f"tier{i}"
        tier.mkdir()
        p = subprocess.Popen(
            [granary_bin(), "serve", str(path), "--cache-dir", str(tier), "--listen", "127.0.0.1:0"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env={**os.environ, "GRANARY_PEER_SECRET": SECRET})
        line = p.stdout.readline().strip()
        assert line.startswith("listening on http://"), line
        procs.append(p)
        addrs.append(line[len("listening on http://"):])
        tiers.append(tier)
    yield addrs, tiers, procs
    for p in procs:
        p.kill()
        p.wait()


def read(path, epoch, rank, tiers, addrs, **kw):
    kw.setdefault("peer_secret", SECRET)
    s = granary.Stream(str(path), epoch, rank, 2, 0, 1, cache_dir=str(tiers[rank]),
                       cache_size=1 << 20, peers=addrs, peer_timeout=0.5, **kw)
    got = {i: bytes(d) for i, _, d, _, _ in s}
    peers = [la for la in s.layers() if la["layer"] == "peers"]
    return got, (sum(la["served_samples"] for la in peers), sum(la["served_bytes"] for la in peers))


def test_a_rank_reads_the_other_nodes_tier_and_survives_its_death(packed, nodes):
    path, files = packed
    addrs, tiers, procs = nodes
    ds = granary.Dataset(path)
    want = {i: files[ds.path(i)] for i in range(len(ds))}
    # Epoch 0 fills each node's tier with what its rank reads.
    for r in (0, 1):
        got, _ = read(path, 0, r, tiers, addrs)
        assert all(want[i] == d for i, d in got.items())
    # Epoch 1: rank 0 gets the chunks node 1 keeps from node 1.
    got, (samples, nbytes) = read(path, 1, 0, tiers, addrs)
    assert all(want[i] == d for i, d in got.items())
    assert samples > 0 and nbytes > 0
    # Without the job's secret the peer refuses: every sample still right, from origin.
    for secret in ("not-the-secret-of-this-job", None):
        if secret is None:
            os.environ.pop("GRANARY_PEER_SECRET", None)
        refused, (samples, _) = read(path, 1, 0, tiers, addrs, peer_secret=secret)
        assert refused == got and samples == 0
    # The job's secret through the environment (what job_secret() sets) works as well.
    os.environ["GRANARY_PEER_SECRET"] = SECRET
    try:
        again, (samples, _) = read(path, 1, 0, tiers, addrs, peer_secret=None)
    finally:
        del os.environ["GRANARY_PEER_SECRET"]
    assert again == got and samples > 0
    # Node 1 dies: the same epoch reads every sample right from origin instead.
    procs[1].kill()
    procs[1].wait()
    again, (samples, _) = read(path, 1, 0, tiers, addrs)
    assert again == got
    assert samples == 0


def test_peers_need_a_tier_and_a_sound_list(packed, nodes):
    path, _ = packed
    addrs, tiers, _ = nodes
    with pytest.raises(ValueError, match="cache_dir"):
        granary.IterableDataset(path, peers=addrs)
    with pytest.raises(ValueError, match="peer_timeout"):
        granary.Stream(str(path), 0, 0, 2, 0, 1, cache_dir=str(tiers[0]), cache_size=1 << 20,
                       peers=addrs, peer_timeout=0)
    with pytest.raises(ValueError, match="host:port"):
        granary.Stream(str(path), 0, 0, 2, 0, 1, cache_dir=str(tiers[0]), cache_size=1 << 20,
                       peers=["http://x:1", addrs[1]])
    with pytest.raises(ValueError, match="at least 16 bytes"):
        granary.Stream(str(path), 0, 0, 2, 0, 1, cache_dir=str(tiers[0]), cache_size=1 << 20,
                       peers=addrs, peer_secret="short")
    with pytest.raises(ValueError, match="multiple"):
        granary.Stream(str(path), 0, 0, 3, 0, 1, cache_dir=str(tiers[0]), cache_size=1 << 20,
                       peers=addrs)
    ds = granary.IterableDataset(path, peers=",".join(addrs), cache_dir=tiers[0],
                                 cache_size=1 << 20, rank=0, world_size=2)
    assert ds.peers == addrs
    assert len(list(ds)) > 0
