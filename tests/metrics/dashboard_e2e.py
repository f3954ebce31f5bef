#!/usr/bin/env python3
"""End-to-end test of the metrics and the dashboards against a real Prometheus server.

Starts eight `stowage demo-runtime` processes as one launcher starts the ranks of a job on one
machine: RANK and LOCAL_RANK 0..7 and one STOWAGE_METRICS_ADDR, so each listens on the base port
+ LOCAL_RANK (checked). Rank r runs 8 (r + 1) tokens, so what each pins and peaks at is known and
distinct. Prometheus on loopback scrapes all eight every second (one `job`); once every target has
been scraped several times and has completed steps, every expression of every panel of every
dashboard (template variables substituted) is evaluated through Prometheus's HTTP query API at
one instant. Each must return data; each stowage_* metric a panel names must have been scraped;
no panel may draw one line per rank (a result with more than 5 series that differ only in
identity labels fails); the dashboards' variables (label_values queries, `job` included) must
list values. Then the max/min/topk/bottomk panels are checked against the eight ranks: exactly
for what the ranks' sizes fix (pinned bytes per step, whose device peak is highest), and against
the same instant's per-rank series for what timing decides (step time, bandwidth, stalls).

Standard library only. All traffic stays on 127.0.0.1. Every process started here is ended in
all cases (and dies with this script if it is killed). What needs no server runs first: every
dashboard parses, and every panel of the runtime dashboard filters by $job and $hostname and none
reads `instance`. Without a prometheus binary the rest is skipped (exit 77, which ctest reports
as skipped) with a message saying how to install it.
"""

import argparse
import ctypes
import glob
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

# Stand-ins for Grafana's variables. Rate windows hold several 1 s scrapes.
GRAFANA_BUILTINS = {
    "__rate_interval": "15s",
    "__interval": "5s",
    "__range": "1m",
}
# Every dashboard variable is a label filter used with =~; ".*" selects all, like "All".
ALL = ".*"

DEMO_STARTUP_S = 20
PROMETHEUS_READY_S = 20
SCRAPES_WANTED = 4
SCRAPES_WAIT_S = 30
SKIP = 77  # ctest's SKIP_RETURN_CODE for this test

RANKS = 8
TOKENS_PER_RANK_STEP = 8  # rank r runs 8 (r + 1) tokens
# The demo's built-in plan (cli/demo_runtime_command.cc): 45 layers, the input of every layer
# but the last offloaded, each 4 x 4096 x 2 bytes per token.
OFFLOADED_LAYERS = 44
INPUT_BYTES_PER_TOKEN = 4 * 4096 * 2
TOP = 5  # the dashboards' topk/bottomk
# Labels that tell ranks apart; a result whose series differ only in these is one line per rank.
IDENTITY = {"rank", "local_rank", "gpu", "hostname", "instance", "stage"}


def tokens(rank):
    return TOKENS_PER_RANK_STEP * (rank + 1)


def pinned_per_step(rank):
    return OFFLOADED_LAYERS * tokens(rank) * INPUT_BYTES_PER_TOKEN


class Failure(Exception):
    pass


def die_with_parent():
    """Child preexec: receive SIGKILL when this script dies, so nothing outlives the test."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def free_loopback_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as response:  # 127.0.0.1 only
        return response.status, response.read().decode()


def substitute(expr, variables):
    """Replaces $name and ${name} (and ${name:format}) for the names given; others stay."""

    def replace(match):
        name = match.group(1) or match.group(2)
        return variables.get(name, match.group(0))

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", replace, expr)


def panel_targets(panels):
    for panel in panels:
        yield from panel_targets(panel.get("panels", []))  # rows carry their own panels
        for target in panel.get("targets", []):
            if target.get("expr"):
                yield panel, target


class Prometheus:
    def __init__(self, url):
        self.url = url
        self.time = None  # evaluation instant (unix seconds); None: now

    def query(self, expr):
        params = {"query": expr}
        if self.time is not None:
            params["time"] = f"{self.time:.3f}"
        url = self.url + "/api/v1/query?" + urllib.parse.urlencode(params)
        try:
            _, body = http_get(url)
        except urllib.error.HTTPError as e:
            raise Failure(f"query {expr!r}: HTTP {e.code}: {e.read().decode()[:300]}")
        reply = json.loads(body)
        if reply.get("status") != "success":
            raise Failure(f"query {expr!r}: {reply.get('error')}")
        return reply["data"]["result"]

    def label_values(self, label, match):
        params = {"match[]": match} if match else {}
        url = f"{self.url}/api/v1/label/{label}/values?" + urllib.parse.urlencode(params)
        reply = json.loads(http_get(url)[1])
        if reply.get("status") != "success":
            raise Failure(f"label values {label} for {match!r}: {reply.get('error')}")
        return reply["data"]


def read_demo_endpoint(demo, deadline):
    """Reads the demo's stdout until it prints its endpoint; returns "host:port"."""
    seen = []
    while time.monotonic() < deadline:
        if demo.poll() is not None:
            rest = demo.stdout.read()
            raise Failure(f"demo exited with {demo.returncode} before serving metrics:\n"
                          + "".join(seen) + rest)
        ready, _, _ = select.select([demo.stdout], [], [], 0.5)
        if not ready:
            continue
        line = demo.stdout.readline()
        seen.append(line)
        match = re.search(r"http://([0-9.]+:[0-9]+)/metrics", line)
        if match:
            return match.group(1)
    raise Failure("demo did not print its metrics endpoint in time:\n" + "".join(seen))


def drain(stream, lines):
    """Keeps reading the demo's progress so its pipe never fills; keeps the last lines."""
    for line in stream:
        lines.append(line)
        del lines[:-50]


def free_port_run(count):
    """A base port with `count` consecutive free loopback ports after it (itself included)."""
    for _ in range(50):
        base = free_loopback_port()
        if base + count > 65535:
            continue
        sockets = []
        try:
            for port in range(base, base + count):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise Failure(f"no run of {count} free loopback ports found")


def start_demos(stowage, base, workdir, demos):
    """Eight ranks of one job on this machine, appended to `demos` (so that the caller ends them
    whatever happens here); returns their endpoints in rank order."""
    for rank in range(RANKS):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(RANKS),
                   STOWAGE_METRICS_ADDR=f"127.0.0.1:{base}", STOWAGE_JOB_ID="dashboard-e2e",
                   STOWAGE_LEDGER_DIR=workdir)
        env.pop("STOWAGE_METRICS_STEP_BUCKETS", None)
        demos.append(subprocess.Popen(
            [stowage, "demo-runtime", "--steps=0", "--step-interval=0.1",
             f"--tokens={tokens(rank)}", "--copy-threads=1"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
            preexec_fn=die_with_parent))
    endpoints = []
    deadline = time.monotonic() + DEMO_STARTUP_S
    for rank, demo in enumerate(demos):
        endpoint = read_demo_endpoint(demo, deadline)
        # The runtime's rule, which the demo follows: base + LOCAL_RANK.
        if endpoint != f"127.0.0.1:{base + rank}":
            raise Failure(f"rank {rank} (LOCAL_RANK {rank}) serves {endpoint}, not "
                          f"127.0.0.1:{base + rank} (STOWAGE_METRICS_ADDR base {base} + "
                          "LOCAL_RANK)")
        endpoints.append(endpoint)
    return endpoints


def start_prometheus(binary, workdir, targets, log):
    config = os.path.join(workdir, "prometheus.yml")
    with open(config, "w") as f:
        f.write(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: stowage\n    static_configs:\n"
            f"      - targets: [{', '.join(repr(t) for t in targets)}]\n")
    for _ in range(3):  # the free port may be taken between probing and binding
        port = free_loopback_port()
        process = subprocess.Popen(
            [binary, f"--config.file={config}",
             f"--storage.tsdb.path={os.path.join(workdir, 'data')}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + PROMETHEUS_READY_S
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if http_get(url + "/-/ready", timeout=1)[0] == 200:
                    return process, Prometheus(url)
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.2)
        stop(process)
    raise Failure("prometheus did not become ready (see its log below)")


def stop(process):
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def wait_for_scrapes(prometheus):
    """Until every rank was scraped SCRAPES_WANTED times and completed two steps."""
    deadline = time.monotonic() + SCRAPES_WAIT_S
    last = None
    while time.monotonic() < deadline:
        up = prometheus.query('count_over_time(up{job="stowage"}[1m]) and up{job="stowage"} == 1')
        steps = prometheus.query('stowage_steps_total{job="stowage"} >= 2')
        last = (len(up), [float(u["value"][1]) for u in up], len(steps))
        if len(up) == RANKS and all(float(u["value"][1]) >= SCRAPES_WANTED for u in up) and \
                len(steps) == RANKS:
            return min(int(float(u["value"][1])) for u in up)
        time.sleep(0.5)
    raise Failure(f"not all {RANKS} ranks scraped {SCRAPES_WANTED} times with 2 steps done in "
                  f"{SCRAPES_WAIT_S}s: (targets up, scrapes each, ranks with 2 steps) = {last}")


def check_dashboard(name, dashboard, prometheus, report):
    """Returns the list of failures for one dashboard (parsed JSON)."""
    failures = []

    # Shape: importable anywhere (no numeric id), a stable uid, a datasource variable.
    if "id" not in dashboard or dashboard["id"] is not None:
        failures.append(f"{name}: \"id\" must be null")
    if not dashboard.get("uid"):
        failures.append(f"{name}: no stable \"uid\"")
    variables = dashboard.get("templating", {}).get("list", [])
    if not any(v.get("type") == "datasource" and v.get("name") == "datasource"
               for v in variables):
        failures.append(f"{name}: no $datasource variable")

    substitutions = dict(GRAFANA_BUILTINS)
    for v in variables:
        if v.get("type") == "query":
            substitutions[v["name"]] = ALL
    substitutions["datasource"] = "prometheus"

    # Template variables: each label_values() query must list values.
    for v in variables:
        if v.get("type") != "query":
            continue
        query = v.get("query")
        query = query.get("query") if isinstance(query, dict) else query
        match = re.fullmatch(r"\s*label_values\((?:(.*),\s*)?(\w+)\)\s*", query or "")
        if not match:
            failures.append(f"{name}: variable ${v['name']}: cannot check query {query!r}")
            continue
        selector = substitute(match.group(1) or "", substitutions)
        values = prometheus.label_values(match.group(2), selector)
        report(f"  {'ok' if values else 'FAIL'}  {len(values):3d} values  variable ${v['name']}: "
               f"{query}")
        if not values:
            failures.append(f"{name}: variable ${v['name']} ({query}) lists no values")

    checked_metrics = {}
    count = 0
    for panel, target in panel_targets(dashboard.get("panels", [])):
        count += 1
        title = f"{panel.get('title')!r} [{target.get('refId')}]"
        if panel.get("fieldConfig", {}).get("defaults", {}).get("unit") is None:
            failures.append(f"{name}: panel {panel.get('title')!r} sets no unit")
        datasource = target.get("datasource") or panel.get("datasource") or {}
        if isinstance(datasource, dict) and datasource.get("uid") != "${datasource}":
            failures.append(f"{name}: panel {title} does not use the $datasource variable")
        expr = substitute(target["expr"], substitutions)
        if "$" in re.sub(r'"\$\d+"', "", expr):  # label_replace's "$1" is PromQL's own
            failures.append(f"{name}: panel {title}: unsubstituted variable in {expr!r}")
            continue
        # Every metric a panel names must have been scraped, even inside an expression that
        # would still return something without it.
        for metric in sorted(set(re.findall(r"\bstowage_\w+", expr))):
            if metric not in checked_metrics:
                checked_metrics[metric] = len(prometheus.query(f'{{__name__="{metric}"}}'))
            if checked_metrics[metric] == 0:
                failures.append(f"{name}: panel {title} queries {metric}, which the runtime "
                                "does not export")
        try:
            result = prometheus.query(expr)
        except Failure as e:
            failures.append(f"{name}: panel {title}: {e}")
            report(f"  FAIL  error        {title}: {expr}")
            continue
        report(f"  {'ok' if result else 'FAIL'}  {len(result):3d} series  {title}: {expr}")
        if not result:
            failures.append(f"{name}: panel {title} returned no data: {expr}")
        # Many ranks: a panel draws the job's worst rank or its top few, never a line per rank.
        groups = {}
        for r in result:
            key = tuple(sorted((k, v) for k, v in r["metric"].items()
                               if k not in IDENTITY and k != "__name__"))
            groups[key] = groups.get(key, 0) + 1
        if groups and max(groups.values()) > TOP:
            failures.append(f"{name}: panel {title} draws one line per rank "
                            f"({max(groups.values())} series differing only in "
                            f"{sorted(IDENTITY)}); aggregate (max/min by (job)) or use "
                            f"topk({TOP}, ...): {expr}")
    if count == 0:
        failures.append(f"{name}: no panel expressions")
    report(f"{name}: {count} panel expressions, {len(checked_metrics)} distinct metrics")
    return failures


def value(series):
    return float(series["value"][1])


def by_rank(result):
    return {int(r["metric"]["rank"]): value(r) for r in result}


def check_filters(dashboard):
    """Every panel of the runtime dashboard follows the $job and $hostname variables, and none
    derives the machine from `instance` (a regression: label_replace(..., "instance",
    "(.*):[0-9]+") assumed a scrape address of host:port)."""
    failures = []
    names = [v.get("name") for v in dashboard.get("templating", {}).get("list", [])]
    for wanted in ("job", "hostname", "rank"):
        if wanted not in names:
            failures.append(f"stowage.json: no ${wanted} variable (variables: {names})")
    for panel, target in panel_targets(dashboard.get("panels", [])):
        expr = target["expr"]
        title = f"{panel.get('title')!r} [{target.get('refId')}]"
        for selector in ('job=~"$job"', 'hostname=~"$hostname"'):
            if expr.count("stowage_") != expr.count(selector):
                failures.append(f"stowage.json: panel {title}: not every metric is filtered by "
                                f"{selector}: {expr}")
        if "label_replace" in expr or "instance" in expr:
            failures.append(f"stowage.json: panel {title} reads `instance`; use `hostname`: {expr}")
    return failures


def check_scale(dashboard, prometheus, report):
    """The max/min/topk/bottomk panels of dashboards/stowage.json against the eight ranks."""
    failures = []
    substitutions = dict(GRAFANA_BUILTINS)
    for v in dashboard.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            substitutions[v["name"]] = ALL
    exprs = {(panel.get("title"), target.get("refId")): substitute(target["expr"], substitutions)
             for panel, target in panel_targets(dashboard.get("panels", []))}

    def panel(title, ref="A"):
        if (title, ref) not in exprs:
            raise Failure(f"stowage.json: no panel {title!r} [{ref}] (renamed? update this test)")
        return prometheus.query(exprs[(title, ref)])

    def expect(what, got, want, exact=True):
        ok = got == want if exact else abs(got - want) <= 1e-9 * max(1.0, abs(want))
        report(f"  {'ok' if ok else 'FAIL'}  {what}: {got} (expected {want})")
        if not ok:
            failures.append(f"{what}: got {got}, expected {want}")

    def ranks_of(result):
        return sorted(int(r["metric"]["rank"]) for r in result)

    def top(values, n=TOP, lowest=False):
        return sorted(sorted(values, key=lambda r: values[r], reverse=not lowest)[:n])

    # Exact, from the ranks' sizes: each rank's last step pinned 44 layer inputs of its tokens.
    pinned = prometheus.query('stowage_step_last_host_pinned_peak_bytes{job="stowage"}')
    expect("per-rank last-step pinned peak", by_rank(pinned),
           {r: float(pinned_per_step(r)) for r in range(RANKS)})
    expect("Ranks reporting", [value(r) for r in panel("Ranks reporting")], [float(RANKS)])
    expect("Device memory, worst rank: offloaded at the step's high point",
           value(panel("Device memory, worst rank against plan and budget", "D")[0]),
           float(pinned_per_step(RANKS - 1)))
    node_of = {int(r["metric"]["rank"]): (r["metric"]["hostname"], r["metric"]["numa_node"])
               for r in pinned}
    per_node = {}
    for rank, node in node_of.items():
        per_node[node] = per_node.get(node, 0) + pinned_per_step(rank)
    expect("Pinned host memory, fullest NUMA node: last step's peak",
           value(panel("Pinned host memory, fullest NUMA node", "B")[0]),
           float(max(per_node.values())))
    expect("Pinned host memory, top 5 NUMA nodes",
           {(r["metric"]["hostname"], r["metric"]["numa_node"]): value(r)
            for r in panel("Pinned host memory, top 5 NUMA nodes by last step's peak")},
           {node: float(b) for node, b in sorted(per_node.items(), key=lambda kv: -kv[1])[:TOP]})
    # The demo's device peak grows with its tokens: ranks 3..7 are the top 5.
    observed = by_rank(prometheus.query('stowage_device_observed_peak_bytes{job="stowage"}'))
    expect("per-rank observed device peaks increase with rank",
           sorted(observed, key=observed.get), list(range(RANKS)))
    expect("Device memory, top 5 ranks by observed peak",
           ranks_of(panel("Device memory, top 5 ranks by observed peak")),
           list(range(RANKS - TOP, RANKS)))
    expect("Device memory, worst rank: observed peak",
           value(panel("Device memory, worst rank against plan and budget", "C")[0]),
           max(observed.values()))

    # Timing decides these: checked against the per-rank series at the same instant.
    last = by_rank(prometheus.query('stowage_step_last_duration_seconds{job="stowage"}'))
    expect("Step time: last step, slowest rank", value(panel("Step time", "C")[0]),
           max(last.values()))
    expect("Step time: last step, fastest rank", value(panel("Step time", "D")[0]),
           min(last.values()))
    expect("Slowest 5 ranks, last step", ranks_of(panel("Slowest 5 ranks, last step")), top(last))
    steps = by_rank(prometheus.query('stowage_steps_total{job="stowage"}'))
    expect("Steps completed, slowest rank",
           value(panel("Steps completed, slowest and fastest rank", "A")[0]), min(steps.values()))
    expect("Steps completed, fastest rank",
           value(panel("Steps completed, slowest and fastest rank", "B")[0]), max(steps.values()))
    stalls = by_rank(prometheus.query('stowage_step_last_compute_stall_seconds{job="stowage"}'))
    expect("Compute stalls: worst rank", value(panel("Compute stalls waiting on prefetch")[0]),
           max(stalls.values()))
    rate = GRAFANA_BUILTINS["__rate_interval"]
    for direction in ("d2h", "h2d"):
        bandwidth = by_rank(prometheus.query(
            f'rate(stowage_copy_bytes_total{{job="stowage",direction="{direction}"}}[{rate}]) / '
            f'rate(stowage_copy_seconds_total{{job="stowage",direction="{direction}"}}[{rate}])'))
        if len(bandwidth) != RANKS:
            failures.append(f"{direction} bandwidth of {len(bandwidth)} ranks, not {RANKS}")
            continue
        slowest = [value(r) for r in panel("Copy bandwidth, slowest rank against the link ceiling")
                   if r["metric"].get("direction") == direction]
        expect(f"Copy bandwidth, slowest rank ({direction})", slowest, [min(bandwidth.values())])
        expect(f"Copy bandwidth, slowest 5 ranks ({direction})",
               ranks_of([r for r in panel("Copy bandwidth, slowest 5 ranks per direction")
                         if r["metric"].get("direction") == direction]),
               top(bandwidth, lowest=True))
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stowage", required=True, help="the stowage binary")
    parser.add_argument("--prometheus", default="", help="the prometheus server binary")
    parser.add_argument("--dashboards", required=True, help="folder of Grafana dashboard JSON")
    args = parser.parse_args()

    dashboards = sorted(glob.glob(os.path.join(args.dashboards, "*.json")))
    if not dashboards:
        print(f"FAIL: no dashboards in {args.dashboards}", file=sys.stderr)
        return 1
    # What needs no server is checked first, so it is checked even where the test skips.
    static_failures = []
    for path in dashboards:
        with open(path) as f:
            dashboard = json.load(f)  # a JSON error fails the test here
        if dashboard.get("uid") == "stowage-runtime":
            static_failures += check_filters(dashboard)
    if static_failures:
        print(f"FAIL: {len(static_failures)} problem(s):", file=sys.stderr)
        for failure in static_failures:
            print(f"  - {failure}", file=sys.stderr)
        return 1
    if not args.prometheus or not os.access(args.prometheus, os.X_OK):
        print("SKIP: the prometheus server is not installed (looked for "
              f"{args.prometheus or 'prometheus on PATH'}), so the dashboards' queries were not "
              "run. Install it with scripts/setup-deps (Debian package `prometheus`) and re-run "
              "cmake.", file=sys.stderr)
        return SKIP

    # A SIGTERM (ctest timeout, ^C) unwinds through the finally below like any failure.
    def on_signal(signum, _):
        raise SystemExit(f"interrupted by signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    workdir = tempfile.mkdtemp(prefix="stowage-metrics-e2e-")
    demos = []
    prometheus_process = None
    prometheus_log = open(os.path.join(workdir, "prometheus.log"), "w+")
    failures = []
    demo_lines = [[] for _ in range(RANKS)]
    started = time.monotonic()
    try:
        base = free_port_run(RANKS)
        endpoints = start_demos(args.stowage, base, workdir, demos)
        print(f"{RANKS} ranks serving http://127.0.0.1:{base}..{base + RANKS - 1}/metrics "
              "(base + LOCAL_RANK)")
        for demo, lines in zip(demos, demo_lines):
            threading.Thread(target=drain, args=(demo.stdout, lines), daemon=True).start()
        prometheus_process, prometheus = start_prometheus(args.prometheus, workdir, endpoints,
                                                          prometheus_log)
        print(f"prometheus ready at {prometheus.url}")
        scrapes = wait_for_scrapes(prometheus)
        print(f"every rank scraped at least {scrapes} times "
              f"({time.monotonic() - started:.1f} s since start)")
        prometheus.time = time.time()  # every query below sees the same samples

        # The checks themselves must be able to fail: a panel on a metric nobody exports, even one
        # hidden behind `or` so that the expression still returns data, is caught; so is a panel
        # drawing one line per rank.
        control = {"id": None, "uid": "control", "templating": {"list": []}, "panels": [{
            "title": "control", "datasource": {"uid": "${datasource}"},
            "fieldConfig": {"defaults": {"unit": "bytes"}},
            "targets": [{"refId": "A", "expr": 'stowage_metric_nobody_exports_bytes'},
                        {"refId": "B", "expr": 'stowage_metric_nobody_exports_bytes or '
                                               'stowage_steps_total'},
                        {"refId": "C", "expr": 'stowage_steps_total'}]}]}
        control_failures = check_dashboard("control", control, prometheus, lambda _: None)
        per_rank = [f for f in control_failures if "one line per rank" in f]
        unexported = [f for f in control_failures if "nobody_exports" in f and f not in per_rank]
        if len(unexported) != 3 or len(per_rank) != 2:
            failures.append(f"the checker missed an unexported metric or a line per rank: "
                            f"{control_failures}")
        else:
            print("control: a panel on an unexported metric, and one drawing a line per rank, "
                  "are caught")

        for path in dashboards:
            with open(path) as f:
                dashboard = json.load(f)
            failures += check_dashboard(os.path.basename(path), dashboard, prometheus, print)
            if dashboard.get("uid") == "stowage-runtime":
                print(f"{os.path.basename(path)}: max/min/topk panels over {RANKS} ranks")
                failures += check_scale(dashboard, prometheus, print)
        for rank, demo in enumerate(demos):
            if demo.poll() is not None:
                failures.append(f"rank {rank}'s demo exited early with {demo.returncode}")
    except Failure as e:
        failures.append(str(e))
    finally:
        for demo in demos:
            stop(demo)
        stop(prometheus_process)
        if failures:
            prometheus_log.seek(0)
            log = prometheus_log.read()
            if log.strip():
                print("--- prometheus log ---\n" + log[-4000:])
            for rank, lines in enumerate(demo_lines):
                if lines:
                    print(f"--- rank {rank} demo output (tail) ---\n" + "".join(lines[-5:]))
        prometheus_log.close()
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"wall {time.monotonic() - started:.1f} s")

    if failures:
        print(f"FAIL: {len(failures)} problem(s):", file=sys.stderr)
        for failure in failures:
            print(f"  - {failure}", file=sys.stderr)
        return 1
    print("PASS: every dashboard expression returned data")
    return 0


if __name__ == "__main__":
    sys.exit(main())
