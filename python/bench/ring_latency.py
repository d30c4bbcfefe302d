#!/usr/bin/python3
"""Latency of one synchronous 4 KiB save and load through the Python
client's command ring, with the completion wait's adaptive poll
(evoke.ring.AdaptiveSpin) against a fixed 20 us poll (the client before
issue #26), alternating in the same run on the same daemon.

    /usr/bin/python3 python/bench/ring_latency.py --build build [--ops 2000] [--sets 3]

Starts one evoked, saves a 16-token block of a 1-layer, 1-head, head_dim 64
f16 layout (4 KiB) from the shared-memory arena and loads it back, one
operation at a time, `ops` times per set and mode; prints p50 and p99 of
each operation per mode (medians over the sets) and the ratio.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--sets", type=int, default=3)
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    sys.path.insert(0, os.path.join(build, "python"))
    import evoke
    from evoke import ring as ring_mod

    tmp = tempfile.mkdtemp(prefix="evoke-ring-latency-")
    sock = os.path.join(tmp, "evoked.sock")
    daemon = subprocess.Popen(
        [os.path.join(build, "daemon", "evoked"), "--socket", sock, "--data-dir",
         os.path.join(tmp, "data"), "--pinned-bytes", str(256 << 20), "--metrics-address="],
        stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "evoked.log"), "wb"))
    results = {"adaptive": {"save": [], "load": []}, "fixed 20 us": {"save": [], "load": []}}
    try:
        client = evoke.Client(sock, shm_bytes=64 << 20, wait_for_ready=True)
        client.wait_ready(20.0)
        fp = evoke.make_fingerprint("bench", "ring-latency", n_layers=1, n_kv_heads=1,
                                    head_dim=64, dtype="f16")
        block = client.block_array(fp, 16)
        block.view("uint16")[...] = 0x3c00
        client.open_lease()
        if not client.has_ring:
            raise SystemExit("ring_latency: the client has no ring here")
        ring = client._lease.ring  # The bench switches its poll; not an API.
        for k in range(args.sets):
            for mode in ("fixed 20 us", "adaptive"):
                # max <= base: the window is always base (20 us), as before.
                ring._spin = (ring_mod.AdaptiveSpin(0.00002, 0.0005) if mode == "adaptive"
                              else ring_mod.AdaptiveSpin(0.00002, 0.00002))
                saves, loads = [], []
                for i in range(args.ops + 100):
                    meta = evoke.session_meta(fp, f"lat-{k}-{mode}", i, 16)
                    t0 = time.perf_counter()
                    client.save_many([(meta, block)])
                    t1 = time.perf_counter()
                    client.load_many_into([meta.id], fp, [block])
                    t2 = time.perf_counter()
                    if i >= 100:  # The first 100: warm-up (and the spin's history).
                        saves.append((t1 - t0) * 1e6)
                        loads.append((t2 - t1) * 1e6)
                for op, xs in (("save", saves), ("load", loads)):
                    xs.sort()
                    results[mode][op].append((xs[len(xs) // 2], xs[len(xs) * 99 // 100]))
                client.drop_session("bench", f"lat-{k}-{mode}")
        client.close()
    finally:
        daemon.terminate()
        daemon.wait()
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"{'op':>5} {'mode':>12} {'p50 us':>8} {'p99 us':>8}   (medians of {args.sets} sets "
          f"of {args.ops} ops)")
    for op in ("save", "load"):
        p50 = {}
        for mode in ("fixed 20 us", "adaptive"):
            rows = results[mode][op]
            p50[mode] = statistics.median(r[0] for r in rows)
            p99 = statistics.median(r[1] for r in rows)
            print(f"{op:>5} {mode:>12} {p50[mode]:8.1f} {p99:8.1f}")
        print(f"{op:>5} {'adaptive / fixed p50':>21} {p50['adaptive'] / p50['fixed 20 us']:.2f}")


if __name__ == "__main__":
    main()
