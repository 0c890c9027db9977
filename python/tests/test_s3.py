"""Datasets in an S3 object store (the server of scripts/s3-server.sh, whose env file sets
GRANARY_TEST_S3 and the AWS_* variables): random access, and DataLoader workers forked from a
process that already used the store (each must start its own runtime and connections).
Skipped without a server unless GRANARY_REQUIRE_S3=1."""

import os
import uuid

import pytest

import granary
from conftest import make_tree, run


@pytest.fixture(scope="module")
def s3_packed(tmp_path_factory):
    if not os.environ.get("GRANARY_TEST_S3"):
        if os.environ.get("GRANARY_REQUIRE_S3") == "1":
            pytest.fail("GRANARY_REQUIRE_S3=1 but no S3 server (source scripts/s3-server.sh's env)")
        pytest.skip("no S3 server: run scripts/s3-server.sh start DIR and source DIR/env")
    tmp = tmp_path_factory.mktemp("s3")
    # This process's snapshot cache (the native library reads the variable at each open).
    os.environ["GRANARY_SNAPSHOT_CACHE"] = str(tmp / "snapshots")
    files = make_tree(tmp / "src", 240)
    url = f"s3://granary/pytests/{uuid.uuid4().hex}"
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp / "cache"))
    run("pack", tmp / "src", "-o", url, "--chunk-size", "16KiB", env=env)
    return url, files


def test_random_access_reads_every_sample_from_s3(s3_packed):
    url, files = s3_packed
    ds = granary.Dataset(url)
    assert len(ds) == len(files)
    for i in range(len(ds)):
        data, _label = ds[i]
        assert bytes(data) == files[ds.path(i)]
    assert ds.lookup("c1/f0001.bin") is not None


def test_bad_urls_are_clear_errors(s3_packed):
    url, _ = s3_packed
    with pytest.raises(granary.GranaryError, match="not found") as e:
        granary.Dataset(url + "-missing")
    assert e.value.errno == 2  # ENOENT, as for a missing local dataset
    with pytest.raises(ValueError, match="unknown scheme|not a URL|no such|No such"):
        granary.Dataset("ftp://host/x")


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_workers_read_s3_after_the_parent_did(s3_packed, context):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    url, files = s3_packed
    # The parent uses the store first: its runtime and connections exist before the fork.
    parent = granary.Dataset(url)
    assert bytes(parent[0][0]) == files[parent.path(0)]
    ds = granary.IterableDataset(url, seed=3, batch_size=16)
    ds.set_epoch(2)
    seen = []
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=context)
    for batch in loader:
        for i, data in zip(batch["id"], batch["data"]):
            i = int(i)
            assert bytes(data) == files[parent.path(i)]
            seen.append(i)
    assert sorted(seen) == list(range(len(files)))
    # Map-style too, with the parent's open dataset inherited (fork) or pickled (spawn).
    got = []
    for data, _label in DataLoader(parent, batch_size=None, num_workers=2,
                                   multiprocessing_context=context):
        got.append(bytes(data))
    assert sorted(got) == sorted(files.values())
    del torch


def test_a_writer_publishes_to_s3_snapshot_last_and_resumes(s3_packed, tmp_path):
    """granary.Writer to an s3:// URL: nothing readable until close (the snapshot goes last);
    an interrupted writer resumes from its staging directory."""
    base, _ = s3_packed
    url = base + "-written"
    staging = tmp_path / "staging"
    samples = {f"k/{i:04}": {"jpg": bytes([i % 251]) * (50 + i), "txt": b"t%d" % i} for i in range(300)}
    w = granary.Writer(url, staging=staging, chunk_size=16 << 10, progress=False)
    for j, (k, f) in enumerate(samples.items()):
        if j == 200:
            break
        w.write(k, f)
    w.abort()  # the program stopped: nothing published
    with pytest.raises(granary.GranaryError):
        granary.Dataset(url)
    with granary.Writer(url, staging=staging, chunk_size=16 << 10, resume=True, progress=False) as w:
        flags = [w.write(k, f) for k, f in samples.items()]
    assert flags.count(False) == 200
    ds = granary.Dataset(url)
    assert {ds.path(i): ds[i][0] for i in range(len(ds))} == samples
    assert not staging.exists(), "the staging directory is removed once published"


class _Relay:
    """A TCP relay on 127.0.0.1 in front of the S3 server, which ``kill()`` takes down: every
    connection cut, new ones refused (the store died mid-epoch)."""

    def __init__(self, upstream):
        import socket
        import threading
        from urllib.parse import urlsplit

        u = urlsplit(upstream)
        self.to = (u.hostname, u.port)
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.srv.getsockname()[1]}"
        self.socks = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        import socket
        import threading

        while True:
            try:
                c, _ = self.srv.accept()
                u = socket.create_connection(self.to)
            except OSError:
                return
            with self.lock:
                self.socks += [c, u]
            for a, b in ((c, u), (u, c)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a, b):
        try:
            while True:
                d = a.recv(65536)
                if not d:
                    break
                b.sendall(d)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.close()
                except OSError:
                    pass

    def kill(self):
        import socket

        self.srv.close()
        with self.lock:
            for s in self.socks:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                    s.close()
                except OSError:
                    pass


@pytest.fixture
def dying_store(s3_packed, tmp_path, monkeypatch):
    """The packed dataset reached through a relay, with waits of a second or two."""
    relay = _Relay(os.environ["AWS_ENDPOINT_URL"])
    monkeypatch.setenv("AWS_ENDPOINT_URL", relay.url)
    monkeypatch.setenv("GRANARY_SNAPSHOT_CACHE", str(tmp_path / "snapshots"))
    for var, secs in (("GRANARY_CONNECT_TIMEOUT", "1"), ("GRANARY_REQUEST_TIMEOUT", "1"),
                      ("GRANARY_RETRY_TIMEOUT", "2")):
        monkeypatch.setenv(var, secs)
    yield relay
    relay.kill()


def test_a_store_that_dies_mid_epoch_is_an_error_in_the_training_process(s3_packed, dying_store):
    """The S3 server going away mid-epoch under DataLoader workers: an error reaches the loop
    (it ended "normally" after 272 of 2,400 samples when workers' errors could not be pickled),
    and the map-style Dataset raises rather than hangs."""
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    url, files = s3_packed
    ds = granary.IterableDataset(url, seed=1, batch_size=4, window=1)
    seen = 0
    with pytest.raises(Exception) as e:
        for batch in DataLoader(ds, batch_size=None, num_workers=2):
            seen += len(batch["id"])
            if seen >= 8:
                dying_store.kill()
    assert seen < len(files)
    assert isinstance(e.value, granary.GranaryError), repr(e.value)
    del torch


def test_map_style_reads_from_a_store_that_died_raise(s3_packed, dying_store):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    url, files = s3_packed
    ds = granary.Dataset(url)
    got = 0
    with pytest.raises(Exception) as e:
        for _ in DataLoader(ds, batch_size=None, num_workers=2, shuffle=True, timeout=60):
            got += 1
            if got == 5:
                dying_store.kill()
    assert got < len(files)
    assert isinstance(e.value, granary.GranaryError), repr(e.value)
    del torch
