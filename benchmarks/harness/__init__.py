"""The one harness every benchmark script uses: servers, review texts, /metrics, load clients, rounds, reports.

  python -c "from benchmarks.harness import free_port, reviews; print(free_port(), len(reviews(4)))"

server   `qserve serve` (or any ASGI app under uvicorn) in a child process or the serving image's container:
         start, wait for /ready, its CPU time from /proc, stop; the one place a benchmark starts a child process
         (spawn); ROOT, the repository root every benchmark's paths start from
drain    a SIGTERM under keep-alive and new-connection clients, every request accounted for
data     the review texts, from the embedded dataset via qserve.data
metrics  /metrics scraped with prometheus_client's parser (per worker under serve --workers)
clients  the keep-alive HTTP client, wrk and its Lua, the slow client
rounds   the order of each alternating round
report   report.json + report.md under a provenance header (the one writer every benchmark's report goes
         through), and a benchmark's ending (exit status)
"""

from benchmarks.harness.clients import Conn, lua_string, parse_wrk, post_json, require_wrk, run_wrk, trickle, wrk_lua
from benchmarks.harness.data import review_split, reviews
from benchmarks.harness.metrics import batch_totals, per_worker, scrape, total
from benchmarks.harness.report import finish, machine, write_markdown, write_report
from benchmarks.harness.rounds import in_turn
from benchmarks.harness.server import (
    ROOT,
    Container,
    Server,
    VariantServer,
    archive_tree,
    code_env,
    free_port,
    proc_cpu_s,
    spawn,
    stat_cpu_s,
    thread_cpu_s,
    wait_ready,
)

__all__ = [
    "ROOT",
    "Conn",
    "Container",
    "Server",
    "VariantServer",
    "archive_tree",
    "batch_totals",
    "code_env",
    "finish",
    "free_port",
    "in_turn",
    "lua_string",
    "machine",
    "parse_wrk",
    "per_worker",
    "post_json",
    "proc_cpu_s",
    "require_wrk",
    "review_split",
    "reviews",
    "run_wrk",
    "scrape",
    "spawn",
    "stat_cpu_s",
    "thread_cpu_s",
    "total",
    "trickle",
    "wait_ready",
    "write_markdown",
    "write_report",
    "wrk_lua",
]
