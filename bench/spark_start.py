#!/usr/bin/env python
"""Spark start benchmark: a local session with the class-data archive (`binlake setup spark`) vs. without.

Each round starts two fresh processes side by side in alternating order, one mapping the
archive and one loading classes as usual, and times in each

  (start)  the SparkSession with the Iceberg catalog, as the loader builds it,
  (first)  the loader's first batch (class_archive.exercise: CREATE, append, MERGE, ALTER, DELETE, read),
  (N rows) a MERGE of 1% of a table of N rows (steady work, which the archive should not slow),

then prints the medians and percentiles of both, and their ratios (without / with). `--busy N`
runs N processes that burn a core each meanwhile: a machine that is doing other work (a CI
run, the services beside the loader) is where the start costs most.

    python3 -m bench.spark_start [--rounds 5] [--rows 10000,200000] [--busy 0]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from typing import Any

from bench.common import arguments, percentile
from services.launcher.processes import clean_env
from services.loader import class_archive

CHILD = """
import json, sys, tempfile, time
t0 = time.perf_counter()
from services.loader.class_archive import exercise
from services.loader.spark import CatalogConfig, quiet_log4j, session, stop
plain = {"spark.driver.extraJavaOptions": f"-Dlog4j.configurationFile=file:{quiet_log4j()}"}
spark = session("bench", "local[2]", CatalogConfig(warehouse=tempfile.mkdtemp(prefix="bench-spark-")),
                {} if sys.argv[1] == "archive" else plain)
out = {"start": time.perf_counter() - t0}
t = time.perf_counter()
exercise(spark)
out["first"] = time.perf_counter() - t
for n in map(int, sys.argv[2].split(",")):
    spark.sql(f"CREATE TABLE lake.db.t{n} USING iceberg TBLPROPERTIES ('format-version'='2') AS "
              f"SELECT id, CAST(id AS STRING) v FROM range({n})")
    t = time.perf_counter()
    spark.sql(f"MERGE INTO lake.db.t{n} t USING (SELECT id, 'x' v FROM range(0, {n}, 100)) s ON t.id = s.id "
              "WHEN MATCHED THEN UPDATE SET *")
    out[f"{n} rows"] = time.perf_counter() - t
stop(spark)
print(json.dumps(out))
"""


def run_child(mode: str, rows: str) -> dict[str, float]:
    proc = subprocess.run([sys.executable, "-c", CHILD, mode, rows], env=clean_env(), capture_output=True,
                          text=True, timeout=900, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"the {mode} run failed:\n{proc.stderr[-3000:]}")
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = arguments(__doc__)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rows", default="10000,200000", help="table sizes of the steady MERGE, comma-separated")
    ap.add_argument("--busy", type=int, default=0, help="processes burning a core each during the runs")
    args = ap.parse_args()
    print(f"archive: {class_archive.create()}; {args.busy} busy processes", flush=True)
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        measure(args)
    finally:
        for b in burners:
            b.kill()
            b.wait()


def measure(args: argparse.Namespace) -> None:
    runs: dict[str, list[dict[str, Any]]] = {"archive": [], "plain": []}
    for r in range(args.rounds):
        order = ("archive", "plain") if r % 2 == 0 else ("plain", "archive")
        for mode in order:
            runs[mode].append(run_child(mode, args.rows))
        print(f"round {r + 1}: " + "  ".join(f"{m} start {runs[m][-1]['start']:.1f}s first {runs[m][-1]['first']:.1f}s"
                                             for m in order), flush=True)
    print(f"\n{'measure':<14} {'plain p50':>10} {'archive p50':>12} {'plain p90':>10} {'archive p90':>12} {'ratio':>7}")
    for key in runs["plain"][0]:
        plain = sorted(x[key] for x in runs["plain"])
        archive = sorted(x[key] for x in runs["archive"])
        p50, a50 = statistics.median(plain), statistics.median(archive)
        print(f"{key:<14} {p50:>9.2f}s {a50:>11.2f}s {percentile(plain, 90):>9.2f}s {percentile(archive, 90):>11.2f}s "
              f"{p50 / a50:>6.2f}x")


if __name__ == "__main__":
    main()
