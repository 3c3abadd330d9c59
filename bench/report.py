#!/usr/bin/env python3
"""Turns the keel-bench JSON files of one compare-etcd.sh run into the ratio table (printed),
a summary JSON, docs/BENCHMARKS.md and an SVG bar chart. Standard library only; no network.

Runs are files RUNS/<case>.<system>.<repeat>.json; the systems are `keel` (keel-bench
--route leader: keel-client sends each request to its range's leader), `keel-spread` (--route
spread: raw gRPC round robin over the nodes, which forward to the leader; no retries) and
`etcd` (whose client spreads by itself). A case's ratio is computed per repeat (the systems ran
back to back in the same repeat) and summarized as the median with the min-max spread.
Throughput ratios are Keel/etcd ops/s (higher is better); latency ratios are Keel/etcd
microseconds (lower is better); `ratio` is Keel leader/etcd, `ratio_spread` Keel spread/etcd.
Errors are summed over the repeats, in all and by code (keel-bench's `errors_by_code`).
"""

import argparse
import glob
import json
import os
import statistics
import sys

# (case, metric, comparison, bound, the words). metric: ops | p50 | p99.
TARGETS = [
    ("put-64", "ops", ">=", 2.0, "put throughput ≥ 2× etcd at 64 clients"),
    ("put-16", "ops", ">=", 1.5, "put throughput ≥ 1.5× etcd at 16 clients"),
    ("get-linearizable-64", "ops", ">=", 2.0, "linearizable get throughput ≥ 2× etcd at 64 clients"),
    ("get-follower-64", "ops", ">=", 3.0, "follower get ≥ 3× etcd serializable get (64 clients)"),
    ("put-1", "p50", "<=", 1.0, "sequential put (1 client) p50 latency ≤ etcd's"),
    ("put-16", "p99", "<=", 1.0, "p99 put latency at 16 clients ≤ etcd's"),
    ("lock-1", "ops", ">=", 2.0, "lock acquire+release ≥ 2× etcd Lock+Unlock, 1 client"),
    ("lock-16", "ops", ">=", 2.0, "lock acquire+release ≥ 2× etcd Lock+Unlock, 16 clients (own locks)"),
    ("lock-contended-16", "ops", ">=", 5.0, "contended lock hand-off ≥ 5× etcd (16 clients, one lock)"),
]
# Issue 24 (any client, any node): (case, ratio, metric, comparison, bound, words).
SPREAD_TARGETS = [
    ("get-linearizable-64", "ratio_spread", "ops", ">=", 2.5, "spread linearizable get ≥ 2.5× etcd at 64 clients"),
    ("put-16", "spread_to_leader", "ops", ">=", 0.9, "spread put ≥ 90% of leader-routed put, 16 clients"),
    ("put-64", "spread_to_leader", "ops", ">=", 0.9, "spread put ≥ 90% of leader-routed put, 64 clients"),
]
# Linearizable gets at 64 clients, all sent to the leader by a raw gRPC client, ran at this
# rate when issue 24 was filed (keel-bench through keel-client: 16,000); spread must reach it.
SPREAD_GET_FLOOR = 14_800
METRIC_FIELD = {"ops": "ops_per_sec", "p50": "p50_us", "p99": "p99_us"}
SYSTEMS = ("keel", "keel-spread", "etcd", "keel-etcd")
# The systems of the main table; keel-etcd has a table of its own (`etcd_api_table`).
MAIN_SYSTEMS = ("keel", "keel-spread", "etcd")
# Each ratio: (system, system it is of), per repeat.
RATIOS = {
    "ratio": ("keel", "etcd"),
    "ratio_spread": ("keel-spread", "etcd"),
    "spread_to_leader": ("keel-spread", "keel"),
    "ratio_etcd_api": ("keel-etcd", "etcd"),
    "etcd_api_to_spread": ("keel-etcd", "keel-spread"),
}


def load_runs(runs_dir):
    """{case: {system: {repeat: summary}}}"""
    runs = {}
    for path in sorted(glob.glob(os.path.join(runs_dir, "*.json"))):
        case, system, repeat = os.path.basename(path)[: -len(".json")].rsplit(".", 2)
        with open(path) as file:
            runs.setdefault(case, {}).setdefault(system, {})[int(repeat)] = json.load(file)
    return runs


def spread(values):
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summarize_case(by_system):
    """Medians per system, errors (in all and by code) and per-repeat ratios to etcd of each
    Keel mode for ops/s, p50 and p99."""
    out = {}
    for system in SYSTEMS:
        repeats = by_system.get(system, {})
        out[system] = {
            metric: spread([run[field] for run in repeats.values() if run["ops"] > 0])
            for metric, field in METRIC_FIELD.items()
        }
        out[system]["cpu"] = spread(
            [run["server_cpu_us_per_op"] for run in repeats.values() if run.get("server_cpu_us_per_op")]
        )
        out[system]["errors"] = sum(run["errors"] for run in repeats.values())
        by_code = {}
        for run in repeats.values():
            for code, count in run.get("errors_by_code", {}).items():
                by_code[code] = by_code.get(code, 0) + count
        out[system]["errors_by_code"] = by_code
        out[system]["repeats"] = len(repeats)
    for name, (system, of) in RATIOS.items():
        out[name] = ratios(by_system, system, of)
    return out


def ratios(by_system, system, of):
    """Per metric, the spread of `system`/`of` over the repeats both ran."""
    paired = sorted(set(by_system.get(system, {})) & set(by_system.get(of, {})))
    out = {}
    for metric, field in METRIC_FIELD.items():
        values = []
        for repeat in paired:
            run, base = by_system[system][repeat], by_system[of][repeat]
            if run["ops"] > 0 and base["ops"] > 0 and base[field] > 0:
                values.append(run[field] / base[field])
        out[metric] = spread(values)
    return out


def load_rss(rss_dir):
    """{system: {"nodes": {name: MiB}, "max": MiB}} from files holding VmHWM in kB."""
    rss = {}
    for path in sorted(glob.glob(os.path.join(rss_dir, "*"))):
        name = os.path.basename(path)
        with open(path) as file:
            text = file.read().strip()
        if text:
            system = name.split("-")[0]
            rss.setdefault(system, {"nodes": {}})["nodes"][name] = int(text) / 1024
    for system in rss.values():
        system["max"] = max(system["nodes"].values())
    return rss


def verdict(case, metric, comparison, bound, cases, ratio_name="ratio"):
    summary = cases.get(case)
    if summary is None:
        return "not run", None
    if summary["keel"]["repeats"] == 0:
        return "not implemented yet", None
    ratio = summary.get(ratio_name, {}).get(metric)
    if ratio is None:
        return "no paired result", None
    holds = (lambda r: r >= bound) if comparison == ">=" else (lambda r: r <= bound)
    if holds(ratio["median"]):
        return ("met" if holds(ratio["min"]) and holds(ratio["max"]) else "met (median; not in every repeat)"), ratio
    return "missed", ratio


def fmt_ratio(ratio):
    if ratio is None:
        return "–"
    return f"{ratio['median']:.2f}× ({ratio['min']:.2f}–{ratio['max']:.2f})"


def fmt_num(value, digits=0):
    return "–" if value is None else f"{value:,.{digits}f}"


def median_of(summary, system, metric):
    entry = summary[system][metric]
    return None if entry is None else entry["median"]


def system_done(summary, system):
    return summary.get(system, {}).get("repeats", 0) > 0


def latencies(summary, system):
    if not system_done(summary, system):
        return "–"
    return f"{fmt_num(median_of(summary, system, 'p50'))} / {fmt_num(median_of(summary, system, 'p99'))}"


def results_table(cases, order):
    lines = [
        "| case | Keel ops/s | Keel spread ops/s | etcd ops/s | ops/s Keel/etcd | ops/s spread/etcd | Keel p50 / p99 µs | spread p50 / p99 µs | etcd p50 / p99 µs | p50 Keel/etcd | p99 Keel/etcd | server CPU µs per op K / Ks / e | errors K / Ks / e |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for case in order:
        summary = cases.get(case)
        if summary is None:
            continue
        ops = {
            system: fmt_num(median_of(summary, system, "ops")) if system_done(summary, system) else "–"
            for system in MAIN_SYSTEMS
        }
        if not system_done(summary, "keel"):
            ops["keel"] = "not implemented yet"
        errors = " / ".join(
            str(summary[system]["errors"]) if system_done(summary, system) else "–" for system in MAIN_SYSTEMS
        )
        cpu = " / ".join(fmt_num((summary[system].get("cpu") or {}).get("median")) for system in MAIN_SYSTEMS)
        lines.append(
            f"| {case} | {ops['keel']} | {ops['keel-spread']} | {ops['etcd']} | "
            f"{fmt_ratio(summary['ratio']['ops'])} | {fmt_ratio(summary.get('ratio_spread', {}).get('ops'))} | "
            f"{latencies(summary, 'keel')} | {latencies(summary, 'keel-spread')} | {latencies(summary, 'etcd')} | "
            f"{fmt_ratio(summary['ratio']['p50'])} | {fmt_ratio(summary['ratio']['p99'])} | {cpu} | {errors} |"
        )
    return "\n".join(lines)


def etcd_api_table(cases, order):
    """The cases run through Keel's etcd API: etcd's load generator (etcd-client) pointed at
    Keel's --etcd-listen ports, next to etcd and to Keel spread."""
    lines = [
        "| case | Keel etcd API ops/s | etcd ops/s | ops/s etcd API/etcd | ops/s etcd API/Keel spread | etcd API p50 / p99 µs | p50 etcd API/etcd | server CPU µs per op | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for case in order:
        summary = cases.get(case)
        if summary is None or not system_done(summary, "keel-etcd"):
            continue
        cpu = fmt_num((summary["keel-etcd"].get("cpu") or {}).get("median"))
        lines.append(
            f"| {case} | {fmt_num(median_of(summary, 'keel-etcd', 'ops'))} | {fmt_num(median_of(summary, 'etcd', 'ops'))} | "
            f"{fmt_ratio(summary['ratio_etcd_api']['ops'])} | {fmt_ratio(summary['etcd_api_to_spread']['ops'])} | "
            f"{latencies(summary, 'keel-etcd')} | {fmt_ratio(summary['ratio_etcd_api']['p50'])} | {cpu} | "
            f"{summary['keel-etcd']['errors']} |"
        )
    if len(lines) == 2:
        lines.append("| – | not run | | | | | | | |")
    return "\n".join(lines)


def errors_table(cases, order):
    """One row per case and system that had errors: the count by code, most frequent first."""
    lines = ["| case | system | errors | by code |", "|---|---|---:|---|"]
    for case in order:
        summary = cases.get(case)
        if summary is None:
            continue
        for system in SYSTEMS:
            entry = summary.get(system, {})
            if entry.get("errors", 0) == 0:
                continue
            by_code = sorted(entry.get("errors_by_code", {}).items(), key=lambda item: (-item[1], item[0]))
            codes = ", ".join(f"`{code}` {count}" for code, count in by_code) or "(not recorded)"
            lines.append(f"| {case} | {system} | {entry['errors']} | {codes} |")
    if len(lines) == 2:
        lines.append("| – | – | 0 | none |")
    return "\n".join(lines)


def targets_table(cases, rss):
    lines = ["| target | measured (median, min–max) | status |", "|---|---:|---|"]
    for case, metric, comparison, bound, words in TARGETS:
        status, ratio = verdict(case, metric, comparison, bound, cases)
        lines.append(f"| {words} | {fmt_ratio(ratio)} | {status} |")
    if "keel" in rss and "etcd" in rss:
        keel, etcd = rss["keel"]["max"], rss["etcd"]["max"]
        status = "met" if keel <= etcd else "missed"
        lines.append(f"| peak RSS of a Keel node ≤ an etcd member's | {keel:.0f} MiB vs {etcd:.0f} MiB ({keel / etcd:.2f}×) | {status} |")
    return "\n".join(lines)


def spread_targets_table(cases):
    lines = ["| target | measured (median, min–max) | status |", "|---|---:|---|"]
    for case, ratio_name, metric, comparison, bound, words in SPREAD_TARGETS:
        status, ratio = verdict(case, metric, comparison, bound, cases, ratio_name)
        lines.append(f"| {words} | {fmt_ratio(ratio)} | {status} |")
    summary = cases.get("get-linearizable-64")
    if summary is not None and system_done(summary, "keel-spread"):
        ops = summary["keel-spread"]["ops"]
        holds = ops["min"] >= SPREAD_GET_FLOOR
        status = "met" if holds else ("met (median; not in every repeat)" if ops["median"] >= SPREAD_GET_FLOOR else "missed")
        lines.append(
            f"| spread linearizable get ≥ {SPREAD_GET_FLOOR:,} ops/s (all to the leader when issue 24 was filed), 64 clients "
            f"| {fmt_num(ops['median'])} ({fmt_num(ops['min'])}–{fmt_num(ops['max'])}) | {status} |"
        )
    return "\n".join(lines)


def rss_table(rss):
    lines = ["| system | peak RSS per node (MiB) | largest |", "|---|---|---:|"]
    for system in SYSTEMS:
        if system in rss:
            nodes = ", ".join(f"{name} {mib:.0f}" for name, mib in sorted(rss[system]["nodes"].items()))
            lines.append(f"| {system} | {nodes} | {rss[system]['max']:.0f} |")
    return "\n".join(lines)


def markdown(machine, cases, order, rss, svg_name):
    quick = " (quick mode: 1 repeat, short runs — indicative only)" if machine["mode"] == "quick" else ""
    return f"""# Benchmarks: Keel next to etcd

Latest run: **{machine['date_utc']}** (started {machine['started_utc']}){quick}, written by
`bench/compare-etcd.sh`. Ratios are Keel/etcd, computed per repeat (the systems ran back
to back) and given as the median of {machine['repeats']} repeat(s) with the min–max spread.
Throughput: higher is better. Latency: lower is better.

Keel runs every case twice: **Keel** (`keel-bench --route leader`: keel-client sends each
request to its range's leader and retries) and **Keel spread** (`--route spread`: raw gRPC
calls round robin over the three nodes, which serve linearizable reads themselves with a read
index from the leader and send writes on to it, on a stream per node pair; no retries; every
non-OK answer is an error), as most other clients reach Keel (a gRPC client generated from `proto/`,
a load balancer, etcd's clients). etcd's own client already spreads requests over the
endpoints, so etcd runs once. The targets and the chart are of Keel leader. Server CPU per
op is the user + system time of the system's three server processes over the measured
window (`keel-bench --server-pids`, from `/proc/PID/stat`) divided by the operations
completed in it, median of the repeats (`–`: not measured).

![Keel/etcd ratios](../bench/results/{svg_name})

## Results

{results_table(cases, order)}

Errors by code (summed over the repeats; upper case: the gRPC code of the answer, with Keel's
error detail after `/`; lower case: keel-client's error after its retries; `bench_timeout`:
no answer in 10 s):

{errors_table(cases, order)}

## Through etcd's API

The same etcd load generator (keel-bench `--target etcd`, through the `etcd-client` crate)
pointed at the Keel cluster's `--etcd-listen` ports (docs/ETCD.md), in the same repeats. Its
client spreads requests over the three nodes, so compare with Keel spread. The lock cases
need etcd's leases, which Keel does not serve yet.

{etcd_api_table(cases, order)}

## Targets of issue 7

{targets_table(cases, rss)}

## Targets of issue 24 (spread clients)

Spread/leader is Keel spread over Keel leader-routed in the same repeat. The 10-minute run
without errors is in *Spread clients over a long run* below.

{spread_targets_table(cases)}

## Where a put's time goes

Not regenerated by `compare-etcd.sh`; the figures without the disk are of 2026-12-03 at
`33f787f`, the step table of 2026-12-06.

**Without the disk.** `bench/ceiling.sh` runs four 3-node clusters in one run: etcd and Keel
each with data on this disk (fsync on, as above) and on tmpfs (`/dev/shm`, where an fsync
returns at once, so what is left is CPU, scheduling and the hops between processes); the same
put cases, 3 repeats of 8 s, rotating which setup goes first; Keel without load splits, as
above. Medians of the repeats; ratios to etcd on disk:

| case | etcd, disk | Keel, disk | etcd, tmpfs | Keel, tmpfs |
|---|---:|---:|---:|---:|
| put, 1 client: ops/s | 974 | 561 (0.58×) | 1,628 (1.67×) | 785 (0.81×) |
| put, 1 client: p50 µs | 995 | 1,732 (1.74×) | 595 (0.60×) | 1,234 (1.24×) |
| put, 16 clients: ops/s | 3,450 | 3,189 (0.92×) | 6,626 (1.92×) | 5,018 (1.45×) |
| put, 64 clients: ops/s | 7,084 | 7,190 (1.02×) | 11,243 (1.59×) | 10,688 (1.51×) |

(4 KiB `dd oflag=dsync`: 398 µs before, 385 µs after.) Per repeat, Keel on tmpfs made 1.60×,
1.43× and 1.51× the puts of etcd on disk at 64 clients and 1.49×, 1.46× and 1.41× at 16, with
a p50 of 1.15–1.36× etcd's on disk at 1 client. So Keel without any fsync cost is below the
targets of issue 7 for puts (≥ 2× at 64 clients, ≥ 1.5× at 16, p50 ≤ etcd's at 1 client): no
change of Keel's storage alone can meet them on this machine. Against etcd on tmpfs, Keel on
tmpfs makes 0.48× the puts at 1 client, 0.76× at 16 and 0.95× at 64: the cost that is left
is in Keel's path between processes and threads, and it weighs most when few writes share it.

**One put, step by step.** A throwaway build logged a timestamp (µs, one clock for the three
processes) at each boundary Keel owns on the write path: `98abfc4` (the node-wide Raft log)
plus the timestamps, 3 nodes on loopback, every default, put at 1 client for 12 s; medians
over 13,193 puts (tmpfs) and 8,391 (disk), 2026-12-06. The leader's own append goes to its
log in parallel with the follower's and is off the path; the follower counted is the one
whose reply came first.

| step | tmpfs µs | disk µs | 2026-12-03, tmpfs / disk |
|---|---:|---:|---:|
| leader: request handler → `client_write` called | 8 | 10 | 26 / 28 (to the append) |
| leader: `client_write` → append handed to the log store (Raft loop) | 9 | 11 | |
| leader: append → AppendEntries sent (replication task) | 30 | 33 | 37 / 41 |
| AppendEntries: leader's send → follower's handler (gRPC, node-pair stream) | 75 | 95 | 133 / 143 (a unary call) |
| follower: handler → its writer starts the append (decode, Raft loop, writer wake-up) | 41 | 56 | 75 / 112 |
| follower: append: one write and one `fdatasync` of the log, no redb transaction | 8 | 267 | 135 / 550 (a redb commit) |
| follower: commit → reply ready | 30 | 52 | 41 / 8 |
| reply: follower → leader (gRPC, node-pair stream) | 64 | 74 | 106 / 184 |
| leader: reply → `save_committed` (Raft loop) | 13 | 16 | 69 / 71 |
| leader: `save_committed` barrier (skipped when the writer is idle) | 0 | 0 | 118 / 98 |
| leader: → `apply` called (state-machine task) | 29 | 34 | 18 / 23 |
| leader: `apply` → writer starts (wake-up) | 50 | 48 | 64 / 48 |
| leader: apply transaction and its commit (no fsync) | 122 | 161 | 178 / 178 (to `client_write`'s return) |
| leader: commit → `client_write` returns | 44 | 54 | |
| leader: → handler returns | 6 | 8 | 15 / 15 |
| **in the leader's handler** | **650** | **1,063** | **1,015 / 1,499** |
| client p50 (the rest: client, gRPC both ways, admission) | 942 | 1,509 | 1,357 / 1,874 |

The medians of the steps do not add up to the handler's median exactly. For scale: 4 KiB `dd
oflag=dsync` takes about 390 µs on this disk. What is left on the path, at 1 client on
tmpfs:
- **Hand-offs: about 225 µs.** A put changes thread or task about 14 times: the handler,
  the leader's Raft loop, its replication task, the node-pair stream's sender, the follower's stream task,
  its Raft loop, its writer thread, back through its stream task and the leader's stream
  reader to the replication task and the Raft loop, then the state-machine task, the writer
  thread and the handler. The steps of 29–56 µs above (append → send, follower handler →
  writer, commit → reply, → `apply`, `apply` → writer, commit → return) are each one or
  two wake-ups on two busy cores. All of them but the writer thread's are openraft's own
  tasks and channels, per group.
- **The two gRPC hops: about 140 µs**, down from 240 µs with a unary call per message.
- **The apply transaction: 122 µs**, one put applied and committed in redb without an fsync
  (copy-on-write pages and their checksums; before the change below also 5 tables opened
  for nothing and 19 state rows rewritten). etcd applies a put to its in-memory index and
  to a bbolt transaction it commits every 100 ms.

**A cheaper apply transaction.** An apply opened all 12 tables an apply may write and rewrote
all 19 rows of its range's state (`sm_meta`) in every transaction. It now opens each table on
first use (a put opens 5, 7 with a request id) and rewrites only the rows that changed (a put
changes 4 to 7: applied id, revision, clock, history bytes, and counts of keys, bytes or
requests when they move). Measured with `valgrind --tool=callgrind` on the storage
benchmark `apply/1` (one put with a request id applied to a range of 10,000 keys), collecting only inside the
writer's redb transaction; two runs of each build (2 s and 6 s of iterations), the
difference between them divided by the difference in applies, so the fill of the range
cancels out: **456,000 instructions per apply before, 358,000 after (−21 %)**. The cluster
does not show it above its noise: `bench/ab-keel.sh` of the two builds (3 repeats of 8 s,
2026-12-06 08:50) gave put at 1 client 654, 646, 699 ops/s before against 672, 569, 753
after, and at 64 clients 4,951, 5,074, 5,393 against 4,622, 5,484, 5,331; 8 ranges at 64
clients (two interleaved rounds of 3) 3,187, 3,762, 3,952 and 2,584, 3,065, 3,246 ops/s
before against 3,578, 3,029, 2,868 and 2,868, 3,156, 3,409 after, with 681, 565, 536 against
613, 559, 516 µs of server CPU per put in the second round (8 ranges: the "many" cluster of
`bench/ranges.sh`, each build in turn). Rerun: build the benchmark at both commits (`cargo
bench -p keel-storage --bench storage --no-run`), then for each `valgrind --tool=callgrind
--collect-atstart=no --toggle-collect='keel_storage::writer::Writer::commit_redb'
target/release/deps/storage-<hash> --bench --profile-time 2 '^apply/1$'` and again with
`--profile-time 6`; the cluster with `bench/ab-keel.sh OLD NEW`.

## Load splits during a run

Not regenerated. **Since 2026-12-04 (`keel_meta::load_split_has_room`) a range splits for load
only when a live node holds no replica of it yet**, so that a half can move there; on a cluster
with as many nodes as the replication factor every load split is declined (and counted in
`keel_load_splits_declined_total`). `bench/ab-keel.sh` with both builds at their defaults,
`CASES=put:64 REPEATS=6 DURATION=8s`, one interleaved run on 2026-12-04 (before: `ded418b`,
after: `a89c0ff`), put ops/s per repeat, 0 errors:

| repeat | 1 | 2 | 3 | 4 | 5 | 6 |
|---|---:|---:|---:|---:|---:|---:|
| before (load splits as before) | 8,006 | 7,625 | 5,888 | 5,833 | 5,204 | 4,902 |
| after (declined: every node holds the range) | 7,992 | 7,826 | 7,748 | 7,492 | 7,738 | 7,673 |

The run that found it, figures of 2026-12-03 at `fa55fc6`. One fresh 3-node Keel cluster (data on
disk, fsync on), then six runs of put at 64 clients (8 s after 1 s of warm-up, each after
keel-bench's preload of the 10,000 keys) back to back; bytes written (`/proc/PID/io`) and CPU
time (`/proc/PID/stat`) of the three servers per put, preload included:

| run | default (load splits at 2,500 requests/s for 10 s) | `--range-split-requests-per-sec 0` |
|---|---|---|
| 1 | 7,536 ops/s; 33 KB, 179 µs CPU per put | 7,657 ops/s; 34 KB, 176 µs |
| 2 | 5,863 ops/s; 65 KB, 232 µs | 7,673 ops/s; 39 KB, 174 µs |
| 3 | 5,292 ops/s; 74 KB, 263 µs | 7,463 ops/s; 38 KB, 179 µs |
| 4 | 4,772 ops/s; 81 KB, 295 µs | 7,745 ops/s; 40 KB, 173 µs |
| 5 | 4,704 ops/s; 87 KB, 303 µs | 7,442 ops/s; 43 KB, 179 µs |
| 6 | 4,581 ops/s; 90 KB, 312 µs | 7,589 ops/s; 43 KB, 176 µs |

With the default the range splits while the load lasts (a repeat of the first three runs left
snapshots of ranges 1, 2 and 3 on node 1), all on the same three nodes, two cores and one disk: each part is its own Raft group
with its own appends, replication messages and fsync-paced pipeline, so the same puts cost
more writes and more CPU (*Put throughput with 1 range and with 8 ranges* below measures the
same effect with the leaders spread). A load split pays when it can move part of a range's
work to machines that do not already do it; here every node holds every range, and so the
rule above declines it. `compare-etcd.sh`'s Keel figures before 2026-12-03 (put at 16 and 64 clients about half of a
fresh cluster's) measured a cluster that had split itself during the run. A full run with the
default the same morning (08:34 UTC, at `79e384a`) gave put at 16 and 64 clients 0.43× and
0.47× etcd, against 0.91× and 0.94× in the run above.

## Memory

Peak resident set (VmHWM from `/proc/<pid>/status`, sampled every second) of each server
process over the whole run; both clusters ran for the whole run. etcd's figure includes the
pages of its memory-mapped bbolt file it touched, and etcd keeps every revision (no
auto-compaction by default), so it grows with the writes of the run; redb (Keel) does not memory-map its
file and reads through its own page cache. Keel keeps each range's history too (an hour or
1 GiB by default), and that cache holds its pages: the build before history (`e983361`)
and the one of this run, side by side on 2026-12-05 (a 3-node cluster each, 8 s of puts and
8 s of linearizable gets at 64 clients), grew from 47 and 48 MiB idle to 62–69 and 108–115
MiB per node.

{rss_table(rss)}

## Machine

| | |
|---|---|
| CPUs (`nproc`) | {machine['nproc']} ({machine['cpu']}) |
| memory | {machine['memory']} |
| disk of the data dirs | {machine['disk']} |
| 4 KiB `dd oflag=dsync` write, before / after | {machine['fsync_us_before']} µs / {machine['fsync_us_after']} µs |
| kernel | {machine['kernel']} |
| Keel | commit {machine['keel_commit']}, release build, {machine['rustc']} |
| etcd | {machine['etcd_version']} (Debian `etcd-server`) |

These machines are noisy: other work shares the two cores, and fsync latency swings by about
10× over minutes (compare the two probes above). That is why the script alternates which system
goes first and repeats every case; read the spread, not only the median.

## Setup

- Both clusters: 3 members on 127.0.0.1, data dirs in one temp dir on the same disk, started by
  the script and stopped at the end. etcd runs with its defaults (fsync on every commit);
  Keel runs `keel serve` ×3 with all its defaults (a write is acknowledged once a majority
  fsynced it). Since 2026-12-04 that includes load splits, which a 3-node cluster declines
  (every node holds every range; see *Load splits during a run* below), so Keel serves every
  run from one range as etcd serves it from one Raft group. Runs from 2026-12-03 to that date
  turned load splits off (`--range-split-requests-per-sec 0`); runs before 2026-12-03 split the
  range during the first repeat.
- Load: `keel-bench`, closed loop, each client one request in flight; the clients share
  min(clients, {machine['connections_max']}) client instances (connections). Keel is driven
  twice per case: through `keel-client` (leader cache, request ids; `--route leader`), and as
  raw gRPC calls round robin over the three nodes, which forward to the leader (`--route
  spread`: one channel per node per connection, no retries, every non-OK answer counted as an
  error by its code); etcd through `etcd-client` (balanced over the three members, so
  followers forward writes to the leader as with any etcd client: it spreads already).
- Every run first writes all {machine['keyspace']:,} keys ({machine['value_bytes']}-byte
  values; not for the lock cases), then loads for {machine['warmup']} of warm-up (not
  recorded) and {machine['duration']} measured, keys uniform. Latency is recorded in an
  HdrHistogram (3 significant digits) for operations completing in the measured window.
- Operations: `put`; `get-linearizable` (Keel ReadIndex; etcd's default linearizable range);
  `get-follower` (Keel follower read from whichever replica the connection prefers; etcd
  serializable range, answered by the member it reaches); `lock` (Keel: Acquire + Release,
  each client its own owner; etcd: Lock + Unlock with a session lease per client; each client
  its own lock name); `lock-contended` (all clients one lock name: Keel's waiters queue on the
  leader and a release hands the lock over in its own Raft command; etcd's waiters watch the
  key ahead of theirs).

## Commands

```sh
{machine['command'].strip()}
```

which, per case and repeat, runs (here for put at 64 clients; `--target etcd` for etcd):

```sh
keel-bench --target keel --endpoints 127.0.0.1:27101,127.0.0.1:27102,127.0.0.1:27103 \\
  --op put --clients 64 --connections 8 --duration {machine['duration']} --warmup {machine['warmup']} \\
  --value-bytes {machine['value_bytes']} --keyspace {machine['keyspace']} --seed <repeat> --json <file> \\
  --server-pids <the system's three server pids>
```

## Rerunning

```sh
bench/compare-etcd.sh            # full: 3 repeats, 10 s + 2 s warm-up per run (about 8 min)
bench/compare-etcd.sh --quick    # 1 repeat, 3 s + 1 s (about 1 min)
bench/compare-etcd.sh --repeats 5 --duration 20s --no-docs --keep
bench/ceiling.sh                 # etcd and Keel, each on disk and on tmpfs (about 7 min)
python3 bench/report.py --summary bench/results/latest.json --markdown docs/BENCHMARKS.md \
  --svg bench/results/ratios.svg     # re-render this page from the last run's figures
```

The release build comes first (several minutes from scratch on two cores; set
`CARGO_TARGET_DIR` to keep the benchmark's binaries apart from other builds).

The script installs `etcd-server` with apt when `etcd` is missing, builds release `keel` and
`keel-bench --features etcd` (protoc from the vendored crate, `bench/protoc-path.sh`), and
rewrites this file, `bench/results/ratios.svg` and `bench/results/latest.json`. Run it on an
otherwise idle machine when you can; rerun it when the spread is wide.

## Storage micro benchmarks

`cargo bench -p keel-storage --bench storage` (criterion; about 1 min after the build, never part
of `cargo test`) times keel-storage alone, through its public API and openraft's storage traits,
with its files in `target/tmp` on the repo's disk. Entries carry one 256-byte put with a request
id, like the client load above; only the storage call is timed. `compare-etcd.sh` does not run it
and this section is not regenerated: the medians below are from one run on 2026-12-01 (commit
436ca57 plus the benchmark; 4 KiB `dd oflag=dsync` write: 187 µs).

| benchmark | one iteration | median |
|---|---|---:|
| `redb-commit/none` | bare redb write transaction, one 32-byte row, `Durability::None` | 9.5 µs |
| `redb-commit/immediate` | the same with `Durability::Immediate` (one fdatasync) | 159 µs |
| `append/1` | `LogStore::append` of 1 entry until its flush callback (one `Immediate` commit) | 162 µs |
| `append/16` | the same with 16 entries (79k entries/s) | 202 µs |
| `append/256` | the same with 256 entries (466k entries/s, 131 MiB/s) | 550 µs |
| `apply/1` | `apply` of 1 committed entry to a range of 10,000 keys (one `Durability::None` transaction) | 69 µs |
| `apply/64` | the same with 64 entries (210k entries/s) | 302 µs |
| `snapshot/build` | snapshot file of a range of 10,000 keys (2.8 MB) | 5.7 ms |
| `snapshot/install` | install of that file into a fresh store (received first, untimed) | 13.9 ms |

A one-entry durable append costs little more than a bare redb `Immediate` commit of one row:
`redb-commit/immediate` runs right before `append/1`, and in this run and three reruns of only
that pair (`-- '^(redb-commit/immediate|append/1)$'`) the append took 3–20 µs (2–14 %) longer
than the bare commit (147–159 µs). A non-durable commit takes 9.5 µs, so the fdatasync is about
nine tenths of a one-entry append; the writer hop, log-state read, encoding and callback are the
rest. Compare such figures within one run only: fsync latency here swings by about 10× over
minutes.

## The node-wide Raft log (issue 18)

Not regenerated by `compare-etcd.sh`. Since 2026-12-06 the Raft log of every range is one
node-wide log of segment files (`keel.raft-log/`, docs/ARCHITECTURE.md, *keel-storage*)
instead of a table in `keel.redb`: a batch of appends of any number of ranges is one write
and one `fdatasync` of a preallocated file, with no redb transaction; the state machine
still applies in redb, committed without an fsync and durably at least every 100 ms.
`bench/ab-keel.sh` with both builds at their defaults, `CASES="put:1 put:16 put:64
put:64:spread lock-contended:16" REPEATS=3 DURATION=8s`, one interleaved run on 2026-12-06
05:50 UTC (before: `d5b2e1d`; after: `ada5934`, the write path of `36ac3f8`), ops/s per
repeat, 0 errors in every run:

| case | before | after | after/before per repeat |
|---|---|---|---|
| put, 1 client | 510, 359, 582 | 721, 603, 735 | 1.41×, 1.68×, 1.26× |
| put, 1 client: p50 µs | 1,877, 2,699, 1,658 | 1,258, 1,463, 1,205 | 0.67×, 0.54×, 0.73× |
| put, 1 client: p99 µs | 7,795, 7,607, 5,827 | 6,527, 7,175, 8,263 | |
| put, 16 clients | 2,834, 2,064, 2,354 | 3,512, 2,958, 2,723 | 1.24×, 1.43×, 1.16× |
| put, 64 clients | 5,209, 4,424, 3,880 | 6,565, 5,497, 5,406 | 1.26×, 1.24×, 1.39× |
| put, 64 clients: p99 µs | 26,735, 38,719, 41,503 | 40,927, 38,335, 42,431 | |
| put, 64 clients, spread | 5,200, 4,510, 4,803 | 5,886, 5,481, 6,491 | 1.13×, 1.22×, 1.35× |
| lock contended, 16 clients | 366, 458, 429 | 547, 591, 553 | 1.49×, 1.29×, 1.29× |

How it got there (each an A/B of two builds in one interleaved run the same morning, 2
repeats of 8 s; figures per repeat):
- **The log alone** (`cd84f7d`, durable state-machine commit every second, segments grown
  write by write): put at 1 client 1.2–1.8× and at 64 clients 1.2–1.5× the puts before, but
  p99 at 1 client 17–27 ms against 7 ms, and at 64 clients 65–91 ms against 34–45 ms.
- **Preallocation.** An append that grows the file makes its `fdatasync` commit the new size
  (a journal commit on ext4); segments now grow by 4 MiB of zeros ahead of the appends
  (`RAFT_LOG_PREALLOCATE_BYTES`). Put at 1 client: 730 and 734 ops/s against 454 and 385
  before the log moved, p50 1.28 ms against 2.1 ms.
- **The durable commit's interval.** The tail came from the state machine's durable
  commits: one after a second of non-durable ones holds up the writer thread (and every
  append queued behind it). With the interval at 60 s a lone put's p99 fell from 18.9 and
  24.6 ms to 6.4 and 7.1 ms. A thread that wrote the file's dirty pages back every 100 ms
  off the writer (so the durable commit would find few) changed nothing measurable (p99 at
  1 client 18.0 and 23.6 ms without, 15.5 and 20.7 ms with) and was dropped. 100 ms against
  10 s: put at 1 client 724 and 692 against 761 and 836 ops/s, p99 6.7 and 8.0 against 5.8
  and 6.2 ms; at 64 clients 5,854 and 5,768 against 6,825 and 8,437 ops/s, p99 34.7 and 42.5
  against 70.3 and 66.2 ms. The default is 100 ms (`STORAGE_DURABLE_COMMIT_INTERVAL_MS`):
  the tail of before, with about a fifth less throughput at 64 clients than 10 s would give.

Server CPU per put did not fall measurably: `bench/ranges.sh` below measured 185 µs (64
clients) and 372 µs (16 clients) for one range with the log, against 188–203 µs and
394–431 µs in the runs of 2026-12-04 (not side by side; the build before ran right after
at 285 and 511 µs while the disk was slower). The follower's redb transaction per append
is gone; the leader's apply transaction, openraft's work per entry and the two gRPC hops
per put are not.
Rerun: build `keel` at both commits, then `bench/ab-keel.sh OLD NEW` with the `CASES` above.

## Put throughput with 1 range and with 8 ranges

`bench/ranges.sh` (not run by `compare-etcd.sh`; this section is not regenerated) starts two
3-node Keel clusters side by side (data in one temp dir, fsync on, every default), splits the
second into 8 ranges of equal shares of the bench keys, waits until the rebalancer has spread
their leaders over the nodes (4, 3 and 2 leaders, the meta range included), and runs the same
keel-bench put cases on both, alternating which goes first, 3 repeats (256-byte values, 10k
keys). It also reads the three servers' CPU time (user + system, `/proc/PID/stat`) around each
run and divides it by the puts made. Runs of 2026-12-04, 8 s each, one after the other with
`KEEL=` naming the build (each ratio is within one interleaved run):

| build | case | 1 range (ops/s, runs) | 8 ranges (ops/s, runs) | ratio of medians | server CPU per put, 1 / 8 ranges |
|---|---|---|---|---|---|
| `ded418b` (a unary call per Raft message) | put, 16 clients | 3406 (3519, 3406, 3205) | 1591 (1624, 1582, 1591) | 0.47× | 421 / 1088 µs |
| | put, 64 clients | 7240 (7432, 7240, 7112) | 3688 (3773, 3688, 3572) | 0.51× | 195 / 469 µs |
| `9f7190a` (one stream per node pair) | put, 16 clients | 3554 (3652, 3554, 3249) | 1793 (1840, 1793, 1699) | 0.50× | 394 / 905 µs |
| | put, 64 clients | 7223 (7406, 6918, 7223) | 3838 (3891, 3838, 3704) | 0.53× | 188 / 422 µs |
| `a89c0ff` (same, load splits declined) | put, 16 clients | 3252 (3448, 3205, 3252) | 1677 (1732, 1606, 1677) | 0.52× | 431 / 982 µs |
| | put, 64 clients | 6912 (6912, 6946, 6905) | 3596 (3807, 3552, 3596) | 0.52× | 203 / 454 µs |
| `ada5934` (node-wide Raft log), 2026-12-06 05:58 | put, 16 clients | 3581 (3122, 3581, 3658) | 1846 (1834, 1928, 1846) | 0.52× | 372 / 821 µs |
| | put, 64 clients | 7215 (7473, 7215, 6592) | 4338 (4361, 4338, 3016) | 0.60× | 185 / 351 µs |
| `d5b2e1d` (before it), right after | put, 16 clients | 2633 (2633, 2662, 2053) | 1288 (1142, 1288, 1294) | 0.49× | 511 / 1275 µs |
| | put, 64 clients | 4815 (4815, 4474, 5067) | 2723 (2376, 2723, 2795) | 0.57× | 285 / 596 µs |

More ranges do not add throughput on one 2-core machine: the three servers share the two
cores, and with 8 ranges each put costs about 2.2 times the CPU. Each range is its own openraft
group, so the same load is cut into 8 smaller streams, each with its own appends, replication
rounds, commit notifications and applies for fewer entries. Carrying the Raft messages of all
groups on one stream per node pair (`Raft.Batch`, 2026-12-04) took 8–17 % off the CPU per put
with 8 ranges but left the ratio at about half: the gRPC call per message was not most of the
per-group cost. A flat profile (`perf record` of the three servers, put at 16 clients) shows
the same spread of costs with 1 and with 8 ranges (redb page handling, allocation, task
switches on the writer thread and the runtime): what grows is how often each is paid, once
per group per batch. The node-wide Raft log (2026-12-06) left it there too: 0.52× and 0.60×
with it, 0.49× and 0.57× with the build before it in the run right after (each build's
ratio is within its own interleaved run; the two runs are not, and the disk was slower in
the second), and 8 ranges still cost about twice the CPU per put of one. The log takes one
`fdatasync` per batch whatever the number of ranges, as the shared redb file already did;
what grows with the ranges is per group (openraft's core, replication and apply tasks, and
an apply transaction per group per batch). Rerun: `bench/ranges.sh` (`KEEL`, `REPEATS`,
`DURATION`, `RANGES`, `CLIENTS` override the defaults).

**Where the CPU of 8 ranges goes (2026-12-06).** `perf record --call-graph dwarf` (199 Hz)
of the three servers for 8 s of put at 64 clients, one cluster with 1 range and one split into
8 with leaders spread, `98abfc4`, every default; samples grouped by the outermost Keel or
library frame they fall under, in µs of server CPU per put (the profiler's own cost inflates
every figure by about a third; compare the columns, not the totals with the tables above):

| where | 1 range | 8 ranges |
|---|---:|---:|
| writer: apply of committed entries (`apply_entries`) | 50 | 101 |
| writer: redb commit | 35 | 72 |
| writer: log write and `fdatasync` | 23 | 46 |
| writer: the rest of its loop | 16 | 19 |
| openraft: Raft loop, replication, state-machine task, rest | 27 | 81 |
| gRPC (tonic, hyper, h2): client calls and node-pair streams | 38 | 80 |
| Keel's handlers (`KvService`, the rest of keel-server and keel-raft) | 30 | 44 |
| tokio: parking and waking, scheduler | 22 | 37 |
| **all** | **242** | **481** |

Puts made: 5,522 and 2,975 ops/s. The writer's metrics over the same 8 s: with 1 range the
leader's writer committed 1,018 batches a second, its followers' 511 with 16 requests each;
with 8 ranges every node committed about 620 a second with 6 requests each, and each node's
requests carried about 1.6 puts (an append or an apply of one group holds one or two
entries). Every cost that is paid per group and per batch (openraft's loop and tasks, a
Raft message each way, an append and an apply request to the writer, the apply's table
opens and state rows, the commit's pages) is paid for 1 or 2 puts instead of about 15. The
two columns fit a cost of about 590 µs per group batch over the three servers and 130 µs per
put. More clients make the batches larger but do not close the gap: at 512 clients (64 per
group) 8 ranges made 7,275 puts a second and 1 range 11,948 (single runs, one after the
other), while 1 range at 64 clients made 6,461 and 8 ranges 3,106.

What did not help, each measured and dropped:
- **Fuller stream frames.** The node-pair stream sent 1.07–1.09 messages per frame under this
  load. Yielding to the runtime once before gathering a frame, so that other groups' tasks
  woken by the same commit could queue theirs, raised that to 1.6 (1.45 for the replies), but
  put at 64 clients with 8 ranges did not rise: 4,023 and 3,397 ops/s without, 3,342 and
  3,025 with it on both ends, 3,378 and 3,360 with it on the sending end (one interleaved run
  of 2 rounds). A frame costs little next to what each message carries with it.
- **The apply transaction's instructions** (above): −21 % per one-put apply, within the noise
  of the cluster.

So on this machine more ranges cannot pay while each is an openraft group with its own loop,
tasks and requests to the writer: the next steps are to drive many groups' Raft work from
shared tasks, or to make a group batch cheaper than half a millisecond of CPU. Rerun: the
profile with `perf record -F 199 --call-graph dwarf -p <the three pids> -- sleep 8` while
keel-bench puts at 64 clients, and the writer's counters from `keel_storage_commits_total`
and `keel_storage_requests_total` (`--metrics-listen`).

## Idle ranges

`bench/idle-ranges.sh` (not run by `compare-etcd.sh`; this section is not regenerated) starts
a 3-node release cluster on loopback (data in a temp dir, load splits off), splits the
keyspace into N ranges with `keel cluster split`, waits until no node has logged a
rebalancing action for 15 s (the rebalancer spreads the children's leaders), then samples each
server's CPU time (utime + stime) over 30 s and its VmRSS and VmHWM. Runs of 2026-12-01, before
quiescence (`c46a932`) and after (`582afef`), one after the other on this 2-core machine while
another build ran on it (load average 4–6):

| N | build | CPU, % of one core (nodes 1, 2, 3) | VmRSS MiB | VmHWM MiB | quiesced |
|---|---|---|---|---|---|
| 200 | before | 25.2, 25.3, 25.3 | 100, 97, 98 | 100, 97, 98 | — |
| 200 | after | 0.9, 0.7, 0.7 | 86, 83, 83 | 86, 83, 83 | 201 of 201 replicas on each node |
| 1000 | before | 38.3, 37.7, 38.1 | 789, 761, 768 | 789, 761, 768 | — |
| 1000 | after | 3.1, 2.6, 2.6 | 376, 287, 289 | 376, 287, 289 | 1001 of 1001 |

Before quiescence the 1,000-range cluster never settled: the splits took 194 s (3 of 999
failed on timeouts), elections kept moving leaders (1,398 rebalancing actions, still going after
300 s) and the three nodes wanted more CPU than the machine has, so its figures are capped by
the machine; an earlier run the same day lost 129 of 999 splits. After, every replica of every
range is quiesced: the nodes exchange one heartbeat per peer per second, and the per-range
tasks read a range's storage only after something is applied to it (the range watcher still
reads the store's descriptors every 2 s, one read for all). Node 1 leads the meta range and
runs the rebalancer.
A write to a quiesced range whose leader's node was killed (`kill -9`) was answered after 3.7 s
(client retries included) in that run: the followers woke 2.5 s after the last node heartbeat,
then elected. Since issue 25 they wake 0.8–1.1 s after the leader's last ping (*Failover*, *An
idle (quiesced) range*). The pings (five per peer per second, no payload) and the watcher that
judges them cost each node about 0.4 % of a core: N=200, the builds before and after
(`78bd339`, `3f75d0d`) alternately on 2026-12-04 while a Jepsen run used the machine (after,
before, after, before), % of one core for nodes 1, 2, 3: before 1.1, 0.9, 0.9 and 1.2, 1.1,
1.0; after 1.5, 1.4, 1.4 and 1.6, 1.3, 1.4.
Rerun: `bench/idle-ranges.sh` (`N`, `SAMPLE_S`, `IDLE_WAIT_S`; `KEEL=path BUILD=0` measures
another build).

## Spread clients over a long run, every default on

`bench/spread-soak.sh` (not run by `compare-etcd.sh`; this section is not regenerated) starts
a 3-node Keel with every default on (the rebalancer, load splits: none of the bench flags
above) and runs keel-bench `--route spread --op mixed` (half linearizable gets, half puts,
raw calls round robin over the nodes, no retries) with 64 clients over 8 connection sets for
10 minutes. Run of 2026-12-05 16:17 UTC on `5cc313f` (reader threads): 4,305,826 operations
(7,176 ops/s, p50 8.8 ms, p99 18.2 ms, max 97 ms) and **0 errors**; the range did not split and
its leader did not move. Run of 2026-12-05 (writes forwarded on the `Raft.Forward` stream): 4,443,422
operations (7,406 ops/s, p50 8.5 ms, p99 17.2 ms, max 66 ms) and **0 errors**; the range did
not split (on 3 nodes every load split is declined: each node holds the range already) and
its leader did not move. The run of 2026-12-04, before the stream and before load splits were
declined there: 2,563,364 operations (4,272 ops/s, p50 14.4 ms, p99 31.6 ms, max 116 ms) and
0 errors, while the range split under load into two and the rebalancer moved one leadership.
Leadership moves under load are measured in the next section. Rerun: `bench/spread-soak.sh`
(`DURATION`, `CLIENTS`, `CONNECTIONS`, `READ_RATIO`); it exits 1 if any call failed.

## Follower reads within a staleness bound

`bench/bounded-reads.sh` (not run by `compare-etcd.sh`; this section is not regenerated) starts
a 3-node Keel with every default and runs keel-bench with 64 clients over 8 connections in
both client modes, four reads interleaved in each of 3 repeats of 8 s: linearizable, follower
within 100 ms (`--max-staleness 100ms`: a replica known current with its leader less than
100 ms ago serves it from its own state, an older one makes one read index call first),
follower within 0 ms (always that call first) and follower without a bound. Run of
2026-12-05, ops/s per repeat, **0 errors** in every run:

| route | linearizable | follower, within 100 ms | follower, within 0 ms | follower, no bound |
|---|---|---|---|---|
| leader (keel-client) | 22,479 / 20,218 / 21,634 | 29,091 / 25,334 / 26,781 | 18,015 / 17,563 / 18,454 | 28,885 / 27,382 / 28,682 |
| spread | 17,454 / 16,033 / 16,265 | 25,315 / 22,634 / 23,200 | 17,830 / 16,548 / 16,305 | 24,430 / 25,369 / 25,416 |

A 100 ms bound serves 1.24–1.45× the linearizable reads and at most 11% fewer than unbounded
follower reads; a bound of 0 costs what a linearizable read does (each read waits for its own read
index call). Rerun: `bench/bounded-reads.sh` (`REPEATS`, `DURATION`, `CLIENTS`).

## What a leadership move costs callers

`bench/leader-moves.sh` (not run by `compare-etcd.sh`; this section is not regenerated) starts
a 3-node Keel with every default on and runs keel-bench in both routes with
`--move-leader-every 3s`: every 3 s keel-bench hands each data range's leadership to its next
voter, and the report splits the operations that completed within 1 s of a round of moves
from the rest. Runs of 2026-12-04, 20 s per case, the build before and after the election
wait (a node that knows no leader holds a `no_forward` request up to 300 ms for the election
and then serves it or names the winner) and keel-client's pause before a repeated leader
hint, alternated old, new, old, new on one machine (p99 and max in ms, after a move):

| case | build | ops/s | errors | p99 after move | max after move | p99 steady |
|---|---|---:|---:|---:|---:|---:|
| get-linearizable, 64, leader | old | 15,797 / 13,482 | 11 / 0 | 631 / 637 | 858 / 859 | 6.1 / 9.3 |
| get-linearizable, 64, leader | new | 21,361 / 19,738 | 0 / 0 | 7.3 / 9.1 | 725 / 731 | 6.7 / 8.0 |
| put, 16, leader | old | 2,490 / 3,344 | 0 / 0 | 18.1 / 14.8 | 414 / 205 | 11.9 / 9.3 |
| put, 16, leader | new | 2,662 / 2,546 | 0 / 0 | 14.6 / 15.9 | 57 / 62 | 13.3 / 13.3 |
| get-linearizable, 64, spread | old | 11,148 / 8,614 | 0 / 0 | 17.2 / 21.7 | 1,750 / 63 | 15.1 / 20.1 |
| get-linearizable, 64, spread | new | 15,326 / 13,923 | 0 / 0 | 10.0 / 15.2 | 42 / 49 | 9.7 / 13.8 |
| put, 16, spread | old | 2,011 / 2,212 | 0 / 0 | 17.5 / 18.8 | 45 / 47 | 16.0 / 16.2 |
| put, 16, spread | new | 2,033 / 2,698 | 0 / 0 | 18.7 / 13.0 | 46 / 40 | 17.1 / 13.7 |

Before, a routed read that reached a replica in the middle of the election was answered
`Unavailable` and keel-client paused about half a second before trying again; now a move
costs a routed read a few ms at p99. A few reads still wait up to about 0.7 s.

Run of 2026-12-05, one build (writes forwarded on the `Raft.Forward` stream), 30 s per case,
9 rounds of moves each, the default cases (put 16, linearizable get 64, mixed 64): **0 errors
in all six**. After a move, p99 / max in ms: leader 8.7 / 60, 6.4 / 630, 17.3 / 638; spread
10.9 / 39, 9.8 / 27, 19.7 / 48 (steady p99: leader 8.3, 5.7, 15.2; spread 8.0, 9.3, 18.0).
Rerun: `bench/leader-moves.sh` (`DURATION`, `MOVE_EVERY`, `CASES`; `KEEL=path BENCH=path
KEEL_SKIP_BUILD=1` measures other builds).

## Failover: how long a lost leader stops service

`bench/failover.sh` (not run by `compare-etcd.sh`; this section is not regenerated) runs
keel-jepsen's register workload (3 nodes, 16 clients, 500 ops/s, network namespaces)
repeatedly with kills, pauses and partitions aimed at the leader, and kills of every node,
6 s or more apart, and reads each fault's windows from the histories: from the fault's start
to the first successful read and write, the longest stretch without any success, and the
same counted from the heal (for a kill of every node: from the restart of the last node).
Runs of 2026-12-04 on `491f269`, one after the other (3 × 90 s each, seeds 1–3, 27 events
each; `bench/results/failover.md` and `failover-spread.md`), seconds:

| fault | clients | first read p50 / max | first write p50 / max | from the heal, p50 / max |
|---|---|---:|---:|---:|
| kill of the leader | keel-client | 1.21 / 1.27 | 1.15 / 1.25 | 0.01 / 0.02 |
| | spread | 1.13 / 1.18 | 1.13 / 1.19 | 0.02 / 0.05 |
| pause of the leader | keel-client | 1.26 / 1.27 | 1.27 / 1.27 | 0.01 / 0.01 |
| | spread | 1.13 / 2.03 | 2.03 / 3.04 | 0.01 / 0.02 |
| partition isolating the leader | keel-client | 1.17 / 1.27 | 1.18 / 1.27 | 0.00 / 0.01 |
| | spread | 1.10 / 2.02 | 2.02 / 3.11 | 0.58 / 0.99 |
| kill of every node | keel-client | 3.83 / 5.02 | 3.84 / 5.02 | 0.44 / 1.10 (write 0.44 / 1.20) |
| | spread | 3.79 / 5.10 | 3.79 / 5.11 | 0.41 / 0.51 |

Before (the same script on `f879582`, 5 × 90 s, keel-client only, an earlier run on the
same machine, not interleaved): 3.1–3.4 s p50 and up to 4.0 s for a lost leader, 2.2 s
after the last node of a full restart. What changed: elections start 0.9–1.2 s after the
leader's last heartbeat (heartbeat 100 ms, election timeout 300–600 ms; openraft adds the
600 ms leader lease, which was 2 s), keel-client gives up an attempt at a quiet leader once
another replica names a new one (`Cluster.Leader`), forwarding nodes and follower read index
calls stop waiting on a replaced leader, a restarted node's groups stop holding once every
voter was heard, and peer connections that lost packets are replaced within 2 s.

issue 25's targets (p50 ≤ 1.5 s, max ≤ 3 s; back ≤ 2 s after the last node of a full
restart) are met with keel-client. Spread clients (one raw call, 2 s timeout, no retry)
meet them for kills; a call sent to the paused or isolated leader itself waits out its 2 s,
and a write forwarded to it is answered `OutcomeUnknown` 300 ms after the new leader is
known, so their first write after a pause or partition takes 2.0 s p50 and up to 3.1 s.
A traced run (pause, 16 spread clients, the calls' nodes logged) shows why: the reads
waiting at followers were answered as the election ended (1.05–1.18 s after the pause), the
forwarded writes `OutcomeUnknown` at 1.35–1.48 s, and round robin then sent each client's
next call, or the one after, to the paused node, where it waited its 2 s. By about 1.5 s
every client waited there, so no write was even called on a live node before 2.0 s. No
server can answer for a stopped process: a client that spreads its calls needs its own way
to leave a silent node sooner (a shorter attempt timeout, or checking
`grpc.health.v1.Health`, which a paused node does not answer).
Rerun: `bench/failover.sh` and `CLIENTS=spread bench/failover.sh` (`REPEATS`, `TIME_LIMIT`,
`RATE`, `CONCURRENCY`, `SEED`, `FAULTS`, `FAULT_GAP_MS`; about 5 minutes each with
`REPEATS=3`).

### An idle (quiesced) range

`bench/failover.sh` keeps its range busy, so it never quiesces. `bench/quiet-failover.sh`
(3 nodes, every default on, one data range nobody uses) waits in each round until every
replica of the range reports itself quiesced, then kills (`kill -9`) or pauses (SIGSTOP)
the node leading it and times one `keel put` to the range (a new keel-client process,
retries included) from the fault until it is answered; the node then comes back and the
next round waits for quiet again. Runs of 2026-12-04, `78bd339` (before) and `d5e5807`
alternately (before, after, before, after; 10 rounds each, 5 kills and 5 pauses; 0 errors), seconds,
first run then second:

| fault | build | p50 | max | every round |
|---|---|---:|---:|---|
| kill of the leader | before | 2.75, 2.90 | 2.90, 3.13 | 2.51 2.54 2.75 2.76 2.90; 2.72 2.84 2.90 3.02 3.13 |
| | after | 1.33, 1.39 | 1.59, 1.45 | 1.03 1.30 1.33 1.53 1.59; 1.03 1.26 1.39 1.39 1.45 |
| pause of the leader | before | 2.53, 2.53 | 4.02, 4.76 | 2.27 2.28 2.53 4.01 4.02; 2.52 2.53 2.53 4.32 4.76 |
| | after | 1.00, 1.23 | 1.30, 1.38 | 0.77 0.77 1.00 1.02 1.30; 1.02 1.02 1.23 1.31 1.38 |

Before, the followers of a quiesced range woke only when the leader's node heartbeats had
been missing for 2.5 s, and a new client whose first endpoint or meta range leader was the
paused node waited out a 2 s attempt for its range table and another for its session. Now
every node pings its peers five times a second and the followers wake 0.8–1.1 s after the
last ping (each replica waits its own share of an election timeout more, so that two do not
split the vote); keel-client asks for the range table and a session of the next node too
when one has not answered within 250 ms; and a node forwarding a call to the meta range's
leader follows the new one once its meta replica learns of it. The pings cost a little CPU
on an idle cluster (*Idle ranges*). Rerun: `bench/quiet-failover.sh` (`ROUNDS`; `KEEL=path
KEEL_SKIP_BUILD=1` for another build).

Spurious elections under load: `bench/elections.sh` (every default on, 3 nodes, keel-bench
puts from 64 keel-client clients for 10 minutes) counts elections a follower started because
its election timeout expired; no fault is injected, so every one is spurious. Run of
2026-12-04 on `491f269`: 2,760,183 puts at 4,600 ops/s (p99 27.6 ms), 0 errors, 0 elections
by timeout (the load split the range in three and the rebalancer moved two leaderships: 4
"becomes leader" lines, none from a timeout). Rerun: `bench/elections.sh` (`DURATION`,
`CLIENTS`, `ROUTE`).

## Watchers and writes

`bench/watchers.sh` runs one 3-node cluster at its defaults and the same put case with no
watcher, with 20 watchers that read every change (`keel watch '' --prefix` into /dev/null)
and with 20 watchers that never read (`keel watch` into a pipe nobody reads: the stream
fills its two ready messages and the connection's buffers, then waits on its reader), the
three in turn. The watchers are processes on the same two cores as the servers, so the
"read" rows pay for 20 clients decoding and printing every event too.

Run of 2026-12-05 on `375a36d` (put, 16 clients, 256-byte values, 3 repeats of 8 s, 0 errors):

| watchers | repeat 1 | repeat 2 | repeat 3 |
|---|---|---|---|
| none | 3,295 ops/s, p99 8.1 ms | 2,907 ops/s, p99 10.2 ms | 3,260 ops/s, p99 9.3 ms |
| 20 that never read | 3,312 ops/s, p99 9.0 ms | 3,062 ops/s, p99 10.5 ms | 2,833 ops/s, p99 11.7 ms |
| 20 that read everything | 2,098 ops/s, p99 12.8 ms | 2,042 ops/s, p99 14.3 ms | 1,686 ops/s, p99 16.9 ms |

Watchers that stop reading cost the writes nothing measurable: a stalled stream holds two
messages and reads no history until its reader takes one, and the writes never wait for it.
Watchers that read everything cost 35–48 % here, most of it the 20 client processes sharing
the two cores (each receives every put); the servers' own share is not separated by this
run. Rerun: `cargo build --release -p keel-cli -p keel-bench`, then `bench/watchers.sh
target/release/keel` (`CASE`, `WATCHERS`, `REPEATS`, `DURATION`).

## Watch fan-out against etcd

`bench/watch-fanout.sh` runs a 3-node etcd and a 3-node Keel, both at their defaults, and
takes turns between them (the order rotating): one keel-bench put run of 16 clients while W
watches of every written key, opened by the same keel-bench before the load over 8
connections of their own, receive the events, for W = 0, 1, 100 and 1,000. Each put's value
carries the instant it was sent, so every event gives its put-to-event latency. Keel runs
twice, its puts routed by keel-client (keel) and spread over the nodes (keel-spread); its
watches go through keel-client both times (any replica serves a watch). Server CPU: the
three servers' user and system time over the keel-bench run, per second of it.

Run of 2026-12-05 on `777f70b` (etcd 3.4.23; 3 repeats of 10 s after 2 s of warm-up,
medians; 256-byte values, 10k keys; 0 put errors and 0 watch errors in every run):

| system | watchers | put ops/s | of none | events/s | put→event p50 | p99 | server CPU |
|---|---:|---:|---:|---:|---:|---:|---:|
| keel | 0 | 3,440 | 1.00 | | | | 1.37 |
| keel | 1 | 2,981 | 0.87 | 2,981 | 5.8 ms | 11.0 ms | 1.40 |
| keel | 100 | 2,324 | 0.68 | 232,482 | 9.7 ms | 19.0 ms | 1.40 |
| keel | 1,000 | 727 | 0.21 | 726,129 | 42.1 ms | 86.6 ms | 1.14 |
| keel-spread | 0 | 3,475 | 1.00 | | | | 1.42 |
| keel-spread | 1 | 3,387 | 0.97 | 3,389 | 4.8 ms | 10.2 ms | 1.43 |
| keel-spread | 100 | 2,264 | 0.65 | 226,406 | 9.6 ms | 18.5 ms | 1.41 |
| keel-spread | 1,000 | 733 | 0.21 | 731,654 | 41.5 ms | 86.3 ms | 1.15 |
| etcd | 0 | 3,654 | 1.00 | | | | 1.46 |
| etcd | 1 | 3,679 | 1.01 | 3,679 | 4.0 ms | 8.4 ms | 1.45 |
| etcd | 100 | 1,831 | 0.50 | 183,155 | 8.2 ms | 19.0 ms | 1.40 |
| etcd | 1,000 | 319 | 0.09 | 318,329 | 56.7 ms | 132.1 ms | 1.30 |

Issue 19's targets at 1,000 watchers: events delivered 2.28× etcd's (spread 2.30×; target
≥ 2×: met), put-to-event p99 0.66× etcd's (spread 0.65×; target ≤ 1×: met), put
throughput with 1,000 watchers 21 % of without (spread 21 %, etcd 9 %; target ≥ 90 %:
missed). What the runs show:

- A range's streams on a node linger after an apply before they read it when there are 34
  or more of them (30 µs per stream, at most 10 ms; `limits::WATCH_LINGER_PER_STREAM_US`),
  so each message carries several applies. Before that change (`ae87a83`; the run above is
  the same script on the build after it) each stream sent a message per apply: about 95,000
  socket writes a second across the three servers at 1,000 watchers, a quarter of their CPU
  in the kernel's send path. Two 1,000-watcher runs of 2 repeats of 6 s, one after the
  other the same morning: 1.52× etcd's events with a p99 of 0.92× without the linger, 2.17×
  and 0.74× with a fixed 10 ms one.
- Per event delivered at 1,000 watchers (puts included) Keel's servers spend 1.6 µs of CPU,
  etcd's 4.1 µs. The streams of a range also share their reads of its history
  (`keel_watch_history_reads_total`): before that (`cdc3371`) Keel delivered 0.86× etcd's
  events at 1,000 watchers and spent 5.6 µs per event.
- On two cores the keel-bench process that decodes every event of 1,000 streams takes what
  the servers leave (they use 1.1 to 1.5 cores), so each system's puts, and with them its
  events (every watcher receives every put), fall: the put-throughput target cannot be told
  apart from the watchers' own client on this machine.
- Up to 100 watchers no stream lingers (33 or fewer per range per node). At 1 watcher Keel's
  puts, and so its events, run at 0.81-0.92× etcd's (the write path of issue 18); at 100 it
  delivers 1.24-1.27× etcd's events at the same p99.

Rerun: `bench/watch-fanout.sh` (`--quick` for 1 repeat of 4 s; env `WATCHERS`, `CLIENTS`,
`REPEATS`, `DURATION`, `OUT`).

## Changes measured build against build

`bench/ab-keel.sh OLD NEW` (not run by `compare-etcd.sh`; this section is not regenerated)
runs a 3-node cluster of each of two Keel binaries side by side (data in one temp dir, fsync
on), the same keel-bench cases on both, alternating which goes first, 3 repeats of 8 s
(256-byte values, 10k keys, at most 8 connections).

Run of 2026-12-05 against `732a317` (3 repeats of 8 s, ops/s old → new, 0 errors):

| change | case | repeat 1 | repeat 2 | repeat 3 |
|---|---|---|---|---|
| reader threads per store file run the small reads that serve requests, a burst in one read transaction (`5cc313f`) | linearizable get, 64 spread clients | 15464 → 20438 | 14984 → 20973 | 14981 → 20266 |
| | linearizable get, 64 clients | 18135 → 24250 | 17897 → 22439 | 16590 → 23793 |
| | put, 16 spread clients | 3366 → 3380 | 3177 → 3455 | 3058 → 2989 |

Before, every read ran its redb read transaction on a `spawn_blocking` thread of its own. A
profile of a follower under 64 spread readers (`perf record -g`, 6 s) showed two workers at
80 % of the samples and the other 20 % spread over about 40 blocking threads, with 16 % of
all samples in the kernel switching tasks and 5 % in waking them: the reads one read index
answer releases all arrive at once, and each woke a thread. The reader threads take such a
burst in one wake-up and one transaction. Server CPU per read (user + system of the three
nodes over 10 s of 64 spread clients, one cluster at a time, old and new alternating twice):
102 and 104 µs before, 70 and 67 µs after. p50 at 64 spread clients went from 3,827–3,955 µs
to 2,967–3,053 µs, p99 from 9.8–10.2 ms to 5.9–6.3 ms. Puts do not read. Rerun:
`CASES="get-linearizable:64:spread get-linearizable:64 put:16:spread" bench/ab-keel.sh OLD
NEW`.

Run of 2026-12-05 against `c52697f` (3 repeats of 8 s, ops/s old → new, 0 errors):

| change | case | repeat 1 | repeat 2 | repeat 3 |
|---|---|---|---|---|
| ranges record their history: every write of a key is an event with its states before and after, in the apply's transaction (`829e515`) | put, 1 client | 434 → 403 | 442 → 409 | 447 → 413 |
| | put, 16 clients | 2607 → 2113 | 2394 → 2204 | 2325 → 2022 |
| | put, 64 clients | 4793 → 4518 | 4789 → 4095 | 5571 → 4797 |
| | put, 16 spread clients | 2747 → 2352 | 2378 → 1983 | 2761 → 2260 |
| tried, not kept: the same events also indexed by key (`history_keys`, `71833b6`) | put, 1 client | 415 → 353 | 382 → 313 | 389 → 309 |
| | put, 16 clients | 2035 → 1563 | 2002 → 1378 | 1932 → 1412 |
| | put, 64 clients | 4160 → 3070 | 3919 → 2359 | 4053 → 2554 |
| | put, 16 spread clients | 1961 → 1419 | 1917 → 1264 | 1822 → 1418 |

History costs a put 7–16 %: each write also appends its event (the value twice, before and
after) to the revision-ordered `history` table, in the same transaction and the same fsync.
An index of the events by key cost a random B-tree insert per write on top, 25–40 % in all
(with it but without the values before: 14–27 %), so there is none: a key's history is read
by a bounded scan of its range's events. Rerun: build both commits (`cargo build --release
-p keel-cli -p keel-bench`), copy each `target/release/keel` aside, then
`CASES="put:1 put:16 put:64 put:16:spread" bench/ab-keel.sh OLD NEW`.

Run of 2026-12-04 against `ded418b` (3 repeats of 8 s, ops/s old → new, 0 errors):

| change | case | repeat 1 | repeat 2 | repeat 3 |
|---|---|---|---|---|
| Raft messages of every range ride one stream per node pair (`Raft.Batch`, `9f7190a`) | put, 1 client | 592 → 642 | 582 → 652 | 586 → 652 |
| | put, 16 clients | 3317 → 3516 | 3361 → 3550 | 3344 → 3435 |
| | put, 64 clients | 7486 → 7580 | 7602 → 7379 | 7334 → 7420 |

A lone put's p50 went from 1,644–1,685 µs to 1,500–1,524 µs: one unary gRPC call less per
AppendEntries and per reply. At 64 clients each append already carries many entries, so the
calls were few and the change is within the noise.

Runs of 2026-12-02, ops/s per repeat, old → new:

| change | case | repeat 1 | repeat 2 | repeat 3 |
|---|---|---|---|---|
| the log keeps its latest durable entries in memory (`6872732`) | put, 1 client | 315 → 415 | 405 → 442 | 263 → 340 |
| | put, 16 clients | 2126 → 2332 | 2706 → 2628 | 1414 → 2294 |
| | put, 64 clients | 5034 → 5415 | 5829 → 6306 | 4160 → 5962 |
| | contended lock, 16 clients | 329 → 362 | 215 → 318 | 288 → 330 |
| a get reads its key and the span in one transaction (`96f58f7`) | linearizable get, 64 clients | 11104 → 12267 | 9750 → 9909 | 9403 → 9750 |
| | follower get, 64 clients | 15483 → 20038 | 13794 → 14243 | 17151 → 24136 |
| tried, not kept: the committed index queued without waiting for its commit | put, 1 client | 362 → 389 | 357 → 398 | 414 → 458 |
| | put, 64 clients | 4602 → 3419 | 5066 → 3917 | 5636 → 3878 |

Before the first change every replication and apply read opened a redb read transaction on a
blocking thread, even when the entries were still in memory. The tried change took a writer
round trip out of every commit but made the leader's Raft loop run faster with smaller
batches: at 64 clients over 5 s, 7.5 puts per fsync instead of 14.6 (2,514 durable commits for
18,951 puts against 1,700 for 24,838), so throughput fell.

Runs of 2026-12-02 05:00–05:30 UTC against `20d95df`, same script; the first change 3 repeats
of 6 s, the tried ones 2 or 3 repeats of 6 s:

| change | case | repeat 1 | repeat 2 | repeat 3 |
|---|---|---|---|---|
| the committed log id is not stored; `save_committed` only waits for the writer's queue (`5010a9e`) | put, 1 client | 376 → 405 | 334 → 416 | 465 → 498 |
| | put, 16 clients | 2603 → 2628 | 1859 → 1942 | 2802 → 2931 |
| | put, 64 clients | 5533 → 6139 | 4728 → 4479 | 6083 → 6490 |
| | lock, 1 client | 229 → 213 | 192 → 209 | 242 → 258 |
| | contended lock, 16 clients | 322 → 340 | 346 → 349 | 338 → 343 |
| tried, not kept: `save_committed` answers at once (no wait, no write) | put, 1 client | 405 → 447 | 352 → 400 | |
| | put, 16 clients | 2570 → 2295 | 2173 → 1870 | |
| | put, 64 clients | 4561 → 3588 | 5822 → 3691 | |
| tried, not kept: openraft's `broadcast_submitted_on_append` | put, 1 client | 458 → 479 | 446 → 456 | |
| | put, 64 clients | 6353 → 6401 | 6003 → 5314 | |
| tried, not kept: the writer waits up to 200 µs for more requests when its last durable batch had several | put, 64 clients | 4892 → 5271 | 5371 → 5219 | |
| the same, up to 500 µs | put, 64 clients | 5402 → 5113 | 4597 → 4320 | |
| tried, not kept: mimalloc as the global allocator | put, 64 clients | 4500 → 4836 | 4540 → 4470 | 4872 → 5197 |
| | linearizable get, 64 clients | 10180 → 13650 | 14453 → 13786 | 14320 → 15040 |
| tried, not kept: one tokio worker per node (`TOKIO_WORKER_THREADS=1`) | put, 64 clients | 4889 → 5421 | 5679 → 5849 | |
| | linearizable get, 64 clients | 14654 → 14460 | 13485 → 14012 | |

Runs of 2026-12-03 against `36f5503`, same script, 3 repeats of 6 s:

| change | case | repeat 1 | repeat 2 | repeat 3 |
|---|---|---|---|---|
| `save_committed` answers at once when the writer has nothing outstanding (`fa55fc6`) | put, 1 client | 552 → 541 | 544 → 576 | 535 → 561 |
| | put, 16 clients | 3330 → 3193 | 3223 → 3220 | 3225 → 3279 |
| | put, 64 clients | 7333 → 7290 | 7316 → 7262 | 7194 → 7200 |
| | lock, 1 client | 293 → 311 | 285 → 300 | 291 → 299 |
| | contended lock, 16 clients | 403 → 426 | 402 → 421 | 423 → 443 |

With nothing outstanding in the writer there is nothing to pace, so the barrier is skipped; a
lone put then costs each node 2 writer requests instead of 3 (3,677 requests for 1,825 puts on
the leader, against 5,217 for 1,735 before: `keel_storage_requests_total` around a 3 s put run
at 1 client), and under load the wait that keeps the appends batched stays.

The kept change takes one of the three write transactions each node ran per write out of
the path (a lone put: 2 commits instead of 3, 70 KB instead of 82 KB written per put per node,
that is 17 pages per fsync instead of 20, measured with `/proc/PID/io` and `strace` of the
writer thread) and keeps the wait that makes the Raft loop batch. Taking the wait out too
(the second row) confirms what the previous stop found: smaller appends and more fsyncs, and
puts at 16 and 64 clients fall 11–37 %. The writer waiting for more requests does not bring
that batching back, because the batches are formed in the Raft loop, before the writer.
The others were within the noise or mixed, and one adds a C dependency (mimalloc).
"""


SVG_ROW = 26
SVG_LABEL = 250
SVG_PLOT = 520


def svg(cases, order):
    """Horizontal bars of the median ratio per case and metric, whiskers for min–max, a line at
    1× and a mark at each target."""
    target_of = {(case, metric): bound for case, metric, _, bound, _ in TARGETS}
    rows = []
    for title, metrics in (("throughput, Keel/etcd (higher is better)", ["ops"]),
                           ("latency, Keel/etcd (lower is better)", ["p50", "p99"])):
        rows.append(("title", title))
        for case in order:
            if case not in cases:
                continue
            for metric in metrics:
                if metric != "ops" and cases[case]["ratio"][metric] is None:
                    continue
                label = case if metric == "ops" else f"{case} {metric}"
                rows.append(("bar", label, cases[case]["ratio"][metric], target_of.get((case, metric))))
    scale_max = max([1.0] + [r[2]["max"] for r in rows if r[0] == "bar" and r[2]] +
                    [r[3] for r in rows if r[0] == "bar" and r[3]]) * 1.1
    x = lambda value: SVG_LABEL + value / scale_max * SVG_PLOT
    height = SVG_ROW * (len(rows) + 2)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{SVG_LABEL + SVG_PLOT + 40}" height="{height}" '
           f'font-family="sans-serif" font-size="12">',
           '<rect width="100%" height="100%" fill="white"/>']
    for index, row in enumerate(rows):
        y = SVG_ROW * (index + 1)
        if row[0] == "title":
            out.append(f'<text x="8" y="{y + 16}" font-weight="bold">{row[1]}</text>')
            continue
        _, label, ratio, target = row
        out.append(f'<text x="{SVG_LABEL - 8}" y="{y + 16}" text-anchor="end">{label}</text>')
        if ratio is None:
            out.append(f'<text x="{SVG_LABEL + 6}" y="{y + 16}" fill="#888">Keel: not implemented yet</text>')
        else:
            out.append(f'<rect x="{SVG_LABEL}" y="{y + 5}" width="{x(ratio["median"]) - SVG_LABEL:.1f}" '
                       f'height="{SVG_ROW - 10}" fill="#4a78b5"/>')
            out.append(f'<line x1="{x(ratio["min"]):.1f}" x2="{x(ratio["max"]):.1f}" y1="{y + 13}" y2="{y + 13}" '
                       f'stroke="black"/>')
            out.append(f'<text x="{x(max(ratio["max"], ratio["median"])) + 4:.1f}" y="{y + 17}">'
                       f'{ratio["median"]:.2f}×</text>')
        if target:
            out.append(f'<line x1="{x(target):.1f}" x2="{x(target):.1f}" y1="{y + 2}" y2="{y + SVG_ROW - 2}" '
                       f'stroke="#d04020" stroke-width="2"/>')
    out.append(f'<line x1="{x(1.0):.1f}" x2="{x(1.0):.1f}" y1="{SVG_ROW}" y2="{height - SVG_ROW}" '
               f'stroke="#444" stroke-dasharray="4 3"/>')
    out.append(f'<text x="{x(1.0):.1f}" y="{height - 8}" text-anchor="middle">1× (= etcd)</text>')
    out.append(f'<text x="{SVG_LABEL + SVG_PLOT:.1f}" y="{height - 8}" text-anchor="end" fill="#d04020">'
               f'red mark: target</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", help="directory of <case>.<system>.<repeat>.json files")
    parser.add_argument("--rss", help="directory of per-server VmHWM files (kB)")
    parser.add_argument("--machine", help="machine.json written by compare-etcd.sh")
    parser.add_argument("--summary", help="instead of the three above: a summary JSON written before")
    parser.add_argument("--json", help="write the summary JSON here")
    parser.add_argument("--markdown")
    parser.add_argument("--svg")
    args = parser.parse_args()
    if args.summary:
        with open(args.summary) as file:
            summary = json.load(file)
        machine, cases, rss = summary["machine"], summary["cases"], summary["rss_mib"]
    elif args.runs and args.rss and args.machine:
        with open(args.machine) as file:
            machine = json.load(file)
        runs = load_runs(args.runs)
        cases = {case: summarize_case(runs[case]) for case in case_order(machine) if case in runs}
        rss = load_rss(args.rss)
    else:
        parser.error("give --summary, or --runs, --rss and --machine")
    order = case_order(machine)
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"machine": machine, "cases": cases, "rss_mib": rss}, file, indent=1)
    print(results_table(cases, order))
    print()
    print(errors_table(cases, order))
    print()
    print(targets_table(cases, rss))
    print()
    print(spread_targets_table(cases))
    print()
    print(rss_table(rss))
    if args.svg:
        with open(args.svg, "w") as file:
            file.write(svg(cases, order))
    if args.markdown:
        with open(args.markdown, "w") as file:
            file.write(markdown(machine, cases, order, rss, os.path.basename(args.svg or "ratios.svg")))
    return 0


def case_order(machine):
    return [entry.split("|")[0] for entry in machine["cases"]]


if __name__ == "__main__":
    sys.exit(main())
