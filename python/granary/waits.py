"""Where a training loop waits for its batches, and on what: ``WaitMeter``."""

import os
import time

#: What a batch's wait is attributed to, in report order.
PARTS = ("tier_s", "peers_s", "origin_s", "check_s", "plan_s", "other_s", "python_s",
         "handoff_s")


class WaitMeter:
    """Times a training loop's waits for batches and says what each was spent on.

    ``for batch in granary.WaitMeter(loader): step(batch)`` yields the loader's batches
    unchanged and times each ``next()`` the loop makes: the wait. With batches from
    ``IterableDataset(..., waits=True)`` (a ``"waits"`` dict per batch, made in the process
    that produced the batch: a DataLoader worker, or this one), each wait is split in
    proportion to what making that batch cost: the reader waiting for reads from the tier
    (``tier_s``), other nodes' tiers (``peers_s``) or origin storage (``origin_s``), checking
    CRCs and decompressing (``check_s``), planning windows (``plan_s``), the reader's other
    work (``other_s``), the producing process's Python (``python_s``: gathering, assembling,
    ``transform``); what exceeds the batch's making (a worker's result waiting in DataLoader's
    queues, the first batches while workers start) is ``handoff_s``. The parts of a wait add up
    to it. Batches without ``"waits"``: the whole wait is ``handoff_s``.

    ``report()`` sums an epoch (the last iteration): the loop's wall time, its waits and their
    parts, the time in the loop's own steps, and the rate it would have run at if data were
    free (batches over the steps' time: the headspace). ``batches`` lists each batch's wait and
    parts; ``prometheus()`` gives the report in Prometheus' text format (written to ``path`` if
    given, atomically, for a node exporter's textfile collector).
    """

    def __init__(self, loader):
        self.loader = loader
        self.batches = []
        self._wall = 0.0
        self._tail = 0.0

    def __iter__(self):
        """Every moment of the loop is a wait or a step: the first wait includes
        ``iter(loader)`` (where DataLoader starts its workers), each step runs from the batch
        handed to the loop until the loop asks for the next, and the last wait (for the
        loader to say it is done: workers ending) is ``handoff_s`` of the report."""
        self.batches = []
        self._tail = 0.0
        t_start = t0 = time.perf_counter()
        it = iter(self.loader)
        stepping = None  # (record, when its batch was handed to the loop)
        try:
            while True:
                try:
                    batch = next(it)
                except StopIteration:
                    # The loader's end: dropping the iterator joins its workers (DataLoader
                    # does it when its iterator goes), which the last wait includes.
                    it = None
                    self._tail = time.perf_counter() - t0
                    break
                t1 = time.perf_counter()
                rec = self._attribute(batch, t1 - t0)
                rec["step_s"] = 0.0
                self.batches.append(rec)
                stepping = (rec, t1)
                yield batch
                t0 = time.perf_counter()
                rec["step_s"] = t0 - t1
                stepping = None
        finally:
            now = time.perf_counter()
            if stepping is not None:  # the loop stopped inside its step (break, an error)
                stepping[0]["step_s"] = now - stepping[1]
            self._wall = now - t_start

    @staticmethod
    def _attribute(batch, wait):
        rec = {"wait_s": wait, **{k: 0.0 for k in PARTS}}
        made = None
        try:
            made = batch["waits"] if "waits" in batch else None
        except (TypeError, KeyError, IndexError):
            made = None
        if not made:
            rec["handoff_s"] = wait
            return rec
        cost = {k: max(float(made.get(k, 0.0)), 0.0) for k in PARTS[:-1]}
        total = sum(cost.values())
        share = min(wait, total)
        if total > 0:
            for k, v in cost.items():
                rec[k] = share * v / total
        rec["handoff_s"] = wait - share
        return rec

    def report(self):
        """The last iteration's totals: ``batches``, ``wall_s``, ``wait_s`` and its parts
        (``*_s`` of ``PARTS``), ``step_s`` (the loop's own time), ``batches_per_s`` and
        ``data_free_batches_per_s`` (batches over ``step_s``: how fast the loop would run if
        data were free)."""
        n = len(self.batches)
        r = {"batches": n, "wall_s": self._wall}
        for k in ("wait_s", "step_s") + PARTS:
            r[k] = sum(b[k] for b in self.batches)
        # The last wait, for the loader to end (no batch to attribute it to).
        r["wait_s"] += self._tail
        r["handoff_s"] += self._tail
        r["batches_per_s"] = n / self._wall if self._wall > 0 else 0.0
        r["data_free_batches_per_s"] = n / r["step_s"] if r["step_s"] > 0 else float("inf")
        return r

    def prometheus(self, path=None, labels=None):
        """The report in Prometheus' text exposition format: ``granary_train_wait_seconds{part=...}``
        per part, ``granary_train_step_seconds``, ``granary_train_batches``,
        ``granary_train_wall_seconds`` (with ``labels``, a dict, on every sample); the
        ``granary_train_`` families are the training loop's, apart from ``granary read
        --metrics``'s ``granary_wait_seconds`` (a reader's consumers). Written to ``path``
        (through a temporary file and a rename) if given; returned either way."""
        r = self.report()
        extra = "".join(f',{k}="{v}"' for k, v in (labels or {}).items())
        plain = "{" + extra[1:] + "}" if extra else ""
        lines = [
            "# HELP granary_train_wait_seconds Seconds the training loop waited for batches, by what "
            "the data path spent them on.",
            "# TYPE granary_train_wait_seconds gauge",
        ]
        for k in PARTS:
            lines.append(f'granary_train_wait_seconds{{part="{k[:-2]}"{extra}}} {r[k]:.6f}')
        lines += [
            "# HELP granary_train_step_seconds Seconds the training loop spent in its own steps.",
            "# TYPE granary_train_step_seconds gauge",
            f"granary_train_step_seconds{plain} {r['step_s']:.6f}",
            "# HELP granary_train_wall_seconds Seconds the last epoch took.",
            "# TYPE granary_train_wall_seconds gauge",
            f"granary_train_wall_seconds{plain} {r['wall_s']:.6f}",
            "# HELP granary_train_batches Batches the last epoch delivered.",
            "# TYPE granary_train_batches gauge",
            f"granary_train_batches{plain} {r['batches']}",
        ]
        text = "\n".join(lines) + "\n"
        if path is not None:
            from ._native import publish_file

            # As every file granary writes: a temporary file of its own, then a rename over
            # a regular file (never over a device, a link or a dataset's files).
            publish_file(os.fspath(path), text.encode())
        return text
