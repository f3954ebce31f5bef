#!/usr/bin/env python3
"""End-to-end test of the metrics and the dashboards against a real Prometheus server.

Runs `stowage demo-runtime` with its endpoint on a free loopback port, starts Prometheus on
loopback scraping it every second, waits for scrapes, then evaluates every expression of every
panel of every dashboard (template variables substituted) through Prometheus's HTTP query API.
Each must return a non-empty result, and each stowage_* metric a panel names must have been
scraped, so a panel that queries a metric the runtime does not export fails the test. The
dashboards' template variables (label_values queries) must resolve to values too.

Standard library only. All traffic stays on 127.0.0.1. Every process started here is ended in
all cases (and dies with this script if it is killed).
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
SCRAPES_WANTED = 6
SCRAPES_WAIT_S = 30


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

    def query(self, expr):
        url = self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
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


def start_prometheus(binary, workdir, target, log):
    config = os.path.join(workdir, "prometheus.yml")
    with open(config, "w") as f:
        f.write(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: stowage\n    static_configs:\n"
            f"      - targets: ['{target}']\n")
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
    deadline = time.monotonic() + SCRAPES_WAIT_S
    last = None
    while time.monotonic() < deadline:
        up = prometheus.query('count_over_time(up{job="stowage"}[1m]) and up{job="stowage"} == 1')
        steps = prometheus.query('stowage_steps_total{job="stowage"}')
        last = (up, steps)
        if up and float(up[0]["value"][1]) >= SCRAPES_WANTED and steps and \
                float(steps[0]["value"][1]) > 0:
            return int(float(up[0]["value"][1]))
        time.sleep(0.5)
    raise Failure(f"not enough successful scrapes of the demo in {SCRAPES_WAIT_S}s: {last}")


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
    if count == 0:
        failures.append(f"{name}: no panel expressions")
    report(f"{name}: {count} panel expressions, {len(checked_metrics)} distinct metrics")
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stowage", required=True, help="the stowage binary")
    parser.add_argument("--prometheus", default="", help="the prometheus server binary")
    parser.add_argument("--dashboards", required=True, help="folder of Grafana dashboard JSON")
    args = parser.parse_args()

    if not args.prometheus or not os.access(args.prometheus, os.X_OK):
        print("FAIL: the prometheus server is not installed (looked for "
              f"{args.prometheus or 'prometheus on PATH'}). Install it with tools/setup-deps "
              "(Debian package `prometheus`) and re-run cmake.", file=sys.stderr)
        return 1
    dashboards = sorted(glob.glob(os.path.join(args.dashboards, "*.json")))
    if not dashboards:
        print(f"FAIL: no dashboards in {args.dashboards}", file=sys.stderr)
        return 1

    # A SIGTERM (ctest timeout, ^C) unwinds through the finally below like any failure.
    def on_signal(signum, _):
        raise SystemExit(f"interrupted by signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    workdir = tempfile.mkdtemp(prefix="stowage-metrics-e2e-")
    demo = prometheus_process = None
    prometheus_log = open(os.path.join(workdir, "prometheus.log"), "w+")
    failures = []
    demo_lines = []
    try:
        demo = subprocess.Popen(
            [args.stowage, "demo-runtime", "--metrics-address=127.0.0.1:0", "--steps=0",
             "--step-interval=0.1", "--tokens=64"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            preexec_fn=die_with_parent)
        endpoint = read_demo_endpoint(demo, time.monotonic() + DEMO_STARTUP_S)
        print(f"demo serving http://{endpoint}/metrics")
        threading.Thread(target=drain, args=(demo.stdout, demo_lines), daemon=True).start()
        prometheus_process, prometheus = start_prometheus(args.prometheus, workdir, endpoint,
                                                          prometheus_log)
        print(f"prometheus ready at {prometheus.url}")
        scrapes = wait_for_scrapes(prometheus)
        print(f"{scrapes} successful scrapes of the demo")

        # The check itself must be able to fail: a panel on a metric nobody exports, even one
        # hidden behind `or` so that the expression still returns data, is caught.
        control = {"id": None, "uid": "control", "templating": {"list": []}, "panels": [{
            "title": "control", "datasource": {"uid": "${datasource}"},
            "fieldConfig": {"defaults": {"unit": "bytes"}},
            "targets": [{"refId": "A", "expr": 'stowage_metric_nobody_exports_bytes'},
                        {"refId": "B", "expr": 'stowage_metric_nobody_exports_bytes or '
                                               'stowage_steps_total'}]}]}
        control_failures = check_dashboard("control", control, prometheus, lambda _: None)
        if len([f for f in control_failures if "nobody_exports" in f]) != 3:
            failures.append(f"the checker missed an unexported metric: {control_failures}")
        else:
            print("control: a panel on an unexported metric is caught")

        for path in dashboards:
            with open(path) as f:
                dashboard = json.load(f)
            failures += check_dashboard(os.path.basename(path), dashboard, prometheus, print)
        if demo.poll() is not None:
            failures.append(f"demo exited early with {demo.returncode}")
    except Failure as e:
        failures.append(str(e))
    finally:
        stop(demo)
        stop(prometheus_process)
        if failures:
            prometheus_log.seek(0)
            log = prometheus_log.read()
            if log.strip():
                print("--- prometheus log ---\n" + log[-4000:])
            if demo_lines:
                print("--- demo output (tail) ---\n" + "".join(demo_lines[-20:]))
        prometheus_log.close()
        shutil.rmtree(workdir, ignore_errors=True)

    if failures:
        print(f"FAIL: {len(failures)} problem(s):", file=sys.stderr)
        for failure in failures:
            print(f"  - {failure}", file=sys.stderr)
        return 1
    print("PASS: every dashboard expression returned data")
    return 0


if __name__ == "__main__":
    sys.exit(main())
