#!/usr/bin/python3
"""Python shared-memory save/load against the C++ client, same blocks, same
evoked, same run (the C++ client's rounds, then Python's, per size).

    /usr/bin/python3 python/bench/shm_bench.py --build build \
        [--sizes 1MiB,4MiB,16MiB] [--blocks 16] [--rounds 5] [--sets 3] [--json FILE]

Starts one evoked (tier 1 large enough that nothing spills), then for each
block size alternates, `sets` times, rounds of the C++ client
(evoke-shm-bench-cpp, one process) and of evoke.Client, each side's first
round of a set dropped as warm-up: each round saves `blocks` canonical f16 blocks from shared
memory through the command ring in one batch, loads them back, and deletes
them (untimed). Reports median MiB/s per side and the ratio Python / C++
(goal >= 0.8 at 1 MiB and up).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np


def parse_size(text):
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for u, m in units.items():
        if text.endswith(u):
            return int(float(text[:-len(u)]) * m)
    return int(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--sizes", default="1MiB,4MiB,16MiB")
    ap.add_argument("--blocks", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds per side per set")
    ap.add_argument("--sets", type=int, default=3, help="alternations of C++ then Python")
    ap.add_argument("--json")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    sys.path.insert(0, os.path.join(build, "python"))
    import evoke

    sizes = [parse_size(s) for s in args.sizes.split(",")]
    biggest = max(sizes) * args.blocks
    tmp = tempfile.mkdtemp(prefix="evoke-shm-bench-")
    sock = os.path.join(tmp, "evoked.sock")
    pinned = max(256 << 20, 3 * biggest)
    daemon = subprocess.Popen(
        [os.path.join(build, "daemon", "evoked"), "--socket", sock, "--data-dir",
         os.path.join(tmp, "data"), "--pinned-bytes", str(pinned), "--metrics-address="],
        stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "evoked.log"), "wb"))
    rows = []
    try:
        client = evoke.Client(sock, shm_bytes=2 * biggest + (64 << 20), wait_for_ready=True)
        client.wait_ready(20.0)
        fp = evoke.make_fingerprint("bench", "shm-bench", n_layers=32, n_kv_heads=8,
                                    head_dim=128, dtype="f16")
        per_token = 32 * 8 * 128 * 2 * 2
        for size in sizes:
            n_tokens = size // per_token
            src = [client.block_array(fp, n_tokens) for _ in range(args.blocks)]
            rng = np.random.default_rng(7)
            for a in src:
                a.view(np.uint16)[...] = rng.integers(0, 0x3bff, a.shape, dtype=np.uint16)
            # Back to back on the same daemon, alternating: the C++ client's
            # rounds (one process), then Python's, `sets` times. Each side's
            # first round of a set warms its client, region and the daemon's
            # mapping of it; it is dropped.
            for k in range(args.sets):
                out = subprocess.run(
                    [os.path.join(build, "python-cmake", "evoke-shm-bench-cpp"), "--socket",
                     sock, "--size", str(size), "--blocks", str(args.blocks), "--rounds",
                     str(args.rounds + 1), "--tag", f"cpp-{size}-{k}"],
                    check=True, capture_output=True, text=True)
                for line in out.stdout.strip().splitlines()[1:]:
                    rows.append(json.loads(line))
                for r in range(args.rounds + 1):
                    session = f"py-{size}-{k}-{r}"
                    metas = [evoke.session_meta(fp, session, b, n_tokens)
                             for b in range(args.blocks)]
                    t0 = time.perf_counter()
                    client.save_many(list(zip(metas, src)))
                    t1 = time.perf_counter()
                    client.load_many_into([m.id for m in metas], fp, src)
                    t2 = time.perf_counter()
                    if r > 0:
                        rows.append({"lang": "python", "size": size, "blocks": args.blocks,
                                     "round": r, "set": k, "save_s": t1 - t0,
                                     "load_s": t2 - t1, "ring": client.has_ring})
                    client.delete([m.id for m in metas])
            del src
        client.close()
    finally:
        daemon.terminate()
        daemon.wait()
        shutil.rmtree(tmp, ignore_errors=True)

    summary = []
    print(f"{'size':>8} {'op':>5} {'C++ MiB/s':>10} {'Python MiB/s':>13} {'Python/C++':>11}")
    for size in sizes:
        for op in ("save", "load"):
            rate = {}
            for lang in ("cpp", "python"):
                times = [x[f"{op}_s"] for x in rows if x["lang"] == lang and x["size"] == size]
                rate[lang] = size * args.blocks / statistics.median(times) / (1 << 20)
            ratio = rate["python"] / rate["cpp"]
            summary.append({"size": size, "op": op, "cpp_mib_s": rate["cpp"],
                            "python_mib_s": rate["python"], "ratio": ratio})
            print(f"{size >> 20:>6}MiB {op:>5} {rate['cpp']:>10.0f} {rate['python']:>13.0f} "
                  f"{ratio:>10.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "rows": rows, "summary": summary}, f,
                      indent=1)
    if not all(x["ring"] for x in rows):
        print("warning: some rounds did not use the ring", file=sys.stderr)


if __name__ == "__main__":
    main()
