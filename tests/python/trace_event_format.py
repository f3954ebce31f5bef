"""A check of Chrome's Trace Event Format ("JSON Object Format"), the format chrome://tracing and
Perfetto read: the rules of the format's specification for the event types stowage writes
(complete "X", instant "i", counter "C", metadata "M"), plus that each track's complete events
do not overlap (a viewer nests overlapping spans on one track; stowage's tracks are sequential).

  python3 trace_event_format.py FILE...   prints the problems, exits 1 if any
"""

from __future__ import annotations

import json
import sys

PHASES = {"X", "i", "C", "M"}
METADATA = {"process_name", "thread_name", "process_sort_index", "thread_sort_index"}


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v  # not NaN


def problems(doc) -> list:
    out = []
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return ["the root is not an object with a traceEvents array"]
    if doc.get("displayTimeUnit", "ms") not in ("ms", "ns"):
        out.append(f"displayTimeUnit is {doc['displayTimeUnit']!r}, not 'ms' or 'ns'")
    spans: dict = {}
    for n, e in enumerate(doc["traceEvents"]):
        where = f"traceEvents[{n}]"
        if not isinstance(e, dict):
            out.append(f"{where} is not an object")
            continue
        ph = e.get("ph")
        if ph not in PHASES:
            out.append(f"{where}.ph is {ph!r}, not one of {sorted(PHASES)}")
            continue
        if not isinstance(e.get("name"), str) or not e["name"]:
            out.append(f"{where}.name is missing or empty")
        if not isinstance(e.get("pid"), int):
            out.append(f"{where}.pid is not an integer")
        if ph in ("X", "i") and not isinstance(e.get("tid"), int):
            out.append(f"{where}.tid is not an integer")
        if "args" in e and not isinstance(e["args"], dict):
            out.append(f"{where}.args is not an object")
        if ph == "M":
            if e.get("name") not in METADATA:
                out.append(f"{where}: metadata event named {e.get('name')!r}")
            if not isinstance(e.get("args"), dict) or not e["args"]:
                out.append(f"{where}: metadata event without args")
            continue
        if not _number(e.get("ts")) or e["ts"] < 0:
            out.append(f"{where}.ts is {e.get('ts')!r}, not a number >= 0")
            continue
        if ph == "X":
            if not _number(e.get("dur")) or e["dur"] < 0:
                out.append(f"{where}.dur is {e.get('dur')!r}, not a number >= 0")
                continue
            spans.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"], n))
        elif ph == "i":
            if e.get("s", "t") not in ("g", "p", "t"):
                out.append(f"{where}.s is {e.get('s')!r}, not 'g', 'p' or 't'")
        elif ph == "C":
            args = e.get("args")
            if not isinstance(args, dict) or not args or not all(_number(v) for v in args.values()):
                out.append(f"{where}: counter args must be numbers")
    for (pid, tid), items in spans.items():
        items.sort()
        for (s0, e0, n0), (s1, e1, n1) in zip(items, items[1:]):
            # A microsecond's slack: times are doubles from different sums.
            if s1 < e0 - 1e-3:
                out.append(f"track pid {pid} tid {tid}: traceEvents[{n1}] starts at {s1} before "
                           f"traceEvents[{n0}] ends at {e0}")
                break
    return out


def main(paths) -> int:
    bad = 0
    for path in paths:
        with open(path) as f:
            found = problems(json.load(f))
        for p in found:
            print(f"{path}: {p}")
        bad += bool(found)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
