#!/usr/bin/env python3
"""A job's start as a user sees it, on a lone dev agent: from the register (`PUT
/v1/jobs`) to its alloc's `running`, for two berth binaries in the same run, interleaved.

    python3 host/benches/submit_start.py BEFORE_BIN AFTER_BIN [ROUNDS] [JOBS]

Each round starts one agent of each binary in turn (the order alternates round by
round), each with its own data dir and port, and submits JOBS jobs (20) one after the
other, each one alloc of the mock driver (no process: what is measured is the agent's
path from the request to the task's start, not a spawn), waiting for each to run
before the next. The figures are medians over every job of every round; the run ends
with `summary: name = value` lines, the comparison last. Run as root (the agent
confines tasks), on a quiet machine.

alloc_start and density measure the alloc runner alone; this measures the request's
path through the agent, which is what the one control plane (a lone agent as a
one-node cluster: its scheduler, its store, its node following placements) changed.
"""

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

JOB_HCL = """job "%s" {
  group "g" {
    task "t" {
      driver = "mock"
      config {
        run_for = "1h"
      }
      resources {
        cpu    = 10
        memory = 10
      }
    }
  }
}
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(base, method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(base + path, data=data, method=method)
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"null")


class Agent:
    def __init__(self, binary):
        self.dir = tempfile.mkdtemp(prefix="berth-bench-submit-")
        config = os.path.join(self.dir, "agent.hcl")
        with open(config, "w") as f:
            f.write('plugin "mock" {\n  config {\n    enabled = true\n  }\n}\n')
        self.port = free_port()
        self.base = "http://127.0.0.1:%d" % self.port
        self.log = open(os.path.join(self.dir, "agent.log"), "w")
        self.process = subprocess.Popen(
            [binary, "--config", config, "--data-dir", os.path.join(self.dir, "data"),
             "agent", "-dev", "--http-addr", "127.0.0.1:%d" % self.port],
            stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while True:
            try:
                call(self.base, "GET", "/v1/agent/health")
                return
            except Exception:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError("the agent did not answer: see %s" % self.dir)
                time.sleep(0.05)

    def start_job(self, name):
        """The time from the register to the alloc's `running`, in ms."""
        parsed = call(self.base, "POST", "/v1/jobs/parse",
                      {"JobHCL": JOB_HCL % name, "Canonicalize": True})
        started = time.monotonic()
        call(self.base, "PUT", "/v1/jobs", {"Job": parsed})
        while True:
            allocs = call(self.base, "GET", "/v1/job/%s/allocations" % name)
            if any(a.get("ClientStatus") == "running" for a in allocs or []):
                return (time.monotonic() - started) * 1000.0
            if time.monotonic() - started > 60:
                raise RuntimeError("job %s did not run: see %s" % (name, self.dir))
            time.sleep(0.001)

    def stop(self, jobs):
        # Its allocs stopped first: an agent stopped leaves its tasks running (they are
        # restored when it starts again), and their alloc dirs mounted.
        for name in jobs:
            call(self.base, "DELETE", "/v1/job/%s?purge=true" % name)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            allocs = call(self.base, "GET", "/v1/allocations")
            if not any(a.get("ClientStatus") in ("pending", "running") for a in allocs or []):
                break
            time.sleep(0.05)
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()
        subprocess.run(["rm", "-rf", self.dir], check=False)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    binaries = {"before": sys.argv[1], "after": sys.argv[2]}
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    jobs = int(sys.argv[4]) if len(sys.argv) > 4 else 20
    times = {"before": [], "after": []}
    for round_ in range(rounds):
        order = ["before", "after"] if round_ % 2 == 0 else ["after", "before"]
        for build in order:
            agent = Agent(binaries[build])
            names = ["j%d" % i for i in range(jobs)]
            try:
                took = [agent.start_job(name) for name in names]
            finally:
                agent.stop(names)
            times[build].extend(took)
            print("round %d %s: median %.1f ms, min %.1f, max %.1f" % (
                round_ + 1, build, statistics.median(took), min(took), max(took)))
    before = statistics.median(times["before"])
    after = statistics.median(times["after"])
    print("summary: submit_to_running_before_ms = %.2f" % before)
    print("summary: submit_to_running_after_ms = %.2f" % after)
    print("summary: submit_to_running_after_over_before = %.3f" % (after / before))


if __name__ == "__main__":
    main()
