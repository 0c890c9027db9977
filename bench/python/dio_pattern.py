"""The device's write rate for one pattern of direct writes: what bounds a writer that writes
that way (`Writer(expected=N)` writes each chunk slot's full buffer, about 1 MiB, to
one of ~68 chunk files from four threads; `granary pack` writes whole chunks).

Writes --total bytes as --size KiB `O_DIRECT` writes spread round-robin over --files files
(each write opens its file, as the writer does), from --threads threads, then fsyncs every
file; prints GB/s. The buffer is an anonymous map, advised to use transparent huge pages with
--huge (granary's large buffers are; a direct write from 4 KiB pages scattered over memory
leaves as more, smaller requests).

  python3 bench/python/dio_pattern.py --dir DIR [--size 1024] [--files 68] [--threads 4]
      [--total-mb 2200] [--huge]
"""

import argparse
import mmap
import os
import threading
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True, help="where the files go (removed afterwards)")
    ap.add_argument("--size", type=int, default=1024, help="KiB per write (a multiple of 4)")
    ap.add_argument("--files", type=int, default=68)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--total-mb", type=int, default=2200)
    ap.add_argument("--huge", action="store_true", help="the buffer on transparent huge pages")
    a = ap.parse_args()
    size = a.size << 10
    if size % 4096:
        ap.error("--size must be a multiple of 4 KiB (direct writes are whole blocks)")
    buf = mmap.mmap(-1, size)
    if a.huge:
        buf.madvise(mmap.MADV_HUGEPAGE)
    buf.write(b"x" * size)
    per_file = (a.total_mb << 20) // a.files // size * size
    jobs = iter([(f, off) for off in range(0, per_file, size) for f in range(a.files)])
    os.makedirs(a.dir, exist_ok=True)
    paths = [os.path.join(a.dir, f"dio-{i}") for i in range(a.files)]
    for p in paths:
        open(p, "wb").close()
    lock = threading.Lock()
    errors = []

    def worker():
        while True:
            with lock:
                job = next(jobs, None)
            if job is None or errors:
                return
            try:
                fd = os.open(paths[job[0]], os.O_WRONLY | os.O_DIRECT)
                try:
                    os.pwrite(fd, buf, job[1])
                finally:
                    os.close(fd)
            except OSError as e:
                errors.append(e)

    t = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(a.threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    dt = time.perf_counter() - t
    for p in paths:
        os.unlink(p)
    if errors:
        raise SystemExit(f"direct write failed: {errors[0]}")
    total = per_file * a.files
    pages = "huge pages" if a.huge else "4 KiB pages"
    print(f"{a.size} KiB direct writes over {a.files} files, {a.threads} threads, {pages}: "
          f"{total / dt / 1e9:.2f} GB/s ({total / 1e9:.2f} GB in {dt:.2f} s)")


if __name__ == "__main__":
    main()
