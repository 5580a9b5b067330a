"""What serving costs beyond the model: HTTP and batching on short sentences, the overhead per request (one and two
processes, lanes), the protocols and their cost, length buckets / gRPC / tracing, overload, several models per
server, Ray Serve's sizing; and `qserve predict`, the same runtime streamed over a corpus.

    python -c "from benchmarks.render.blocks.serving import serve_text; print(serve_text())"
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.flood_bench import SLOW_IDLE, SLOW_TRICKLING, median_of
from benchmarks.render.blocks.cells import num, pct, ratio, span, table
from benchmarks.render.blocks.reports import load, on, rendered_from
from benchmarks.serve_protocol_cost import ROUTES, TITLES


def serve() -> str:
    """Serving onnx-int8 over HTTP: unbatched vs batched server, concurrency 1 and 32."""
    rel = "serve/serve_report.json"
    r = load(rel)
    rows = []
    for key, label in (
        ("unbatched", "max batch 1"),
        ("batched", f"max batch {r['settings']['batched_max_batch_size']}"),
    ):
        for lv in r["runs"][key]["levels"]:
            rows.append(
                [
                    label,
                    str(lv["concurrency"]),
                    num(lv["throughput_rps"], 1),
                    num(lv["p50_ms"]),
                    num(lv["p99_ms"]),
                    num(lv.get("mean_batch_size"), 1),
                    str(lv["mismatched"]),
                ]
            )
    s, c = r["summary"], r["model_ceiling"]
    rows.append(
        [
            "the model alone, in process",
            "",
            f"{c['texts_per_s_b1']:.1f} (b1) / {c['texts_per_s_batched']:.1f} (b{c['batch']})",
            num(s["model_b1_p50_ms"]),
            "",
            "",
            "",
        ]
    )
    head = ["server", "concurrency", "req/s", "p50 ms", "p99 ms", "mean batch", "mismatched answers"]
    return table(head, rows) + rendered_from(rel)


def flood() -> str:
    """docs/serving.md's overload paragraph: refusals, the first admitted answer, a normal client beside slow ones."""
    rel = "flood/report.json"
    r = load(rel)
    cfg = r["config"]

    def side(name: str, key: str, fld: str) -> float | None:
        return median_of([(f[key] or {}).get(fld) for f in r["floods"] if f["side"] == name])

    cur, base = "current", "baseline"
    quiet = [s["p50_ms"] for s in r["slow_clients"] if s["condition"] == "quiet"]
    slow = {s["round"]: s["p50_ms"] for s in r["slow_clients"] if s["condition"] == "slow"}
    ratios = [slow[s["round"]] / s["p50_ms"] for s in r["slow_clients"] if s["condition"] == "quiet"]

    def span(xs: list[float], nd: int = 1) -> str:
        return f"{min(xs):.{nd}f}-{max(xs):.{nd}f}"

    return (
        f"Measured (`benchmarks/reports/flood/`, {r['environment']['cpu']['model']}, `{cfg['variant_dir']}`, "
        f"{cfg['requests']} simultaneous one-text requests, `--max-inputs {cfg['max_inputs']} --max-queue "
        f"{cfg['max_queue']}`, {cfg['rounds']} rounds alternating with the server of {cfg['baseline_ref']}, "
        f"medians over the rounds; server times are its histograms' bucket bounds): refusals took <= "
        f"{side(cur, 'server_rejection', 'p50_le_ms'):g} ms each at the median (p99 <= "
        f"{side(cur, 'server_rejection', 'p99_le_ms'):g} ms); the first admitted answer reached the client after "
        f"{side(cur, 'client_200_ms', 'first'):.1f} ms against {side(base, 'client_200_ms', 'first'):.1f} ms "
        f"before (the last {side(cur, 'client_200_ms', 'last'):.1f} against "
        f"{side(base, 'client_200_ms', 'last'):.1f} ms), with {side(cur, 'server_inference', 'count'):.0f} forward "
        f"passes against {side(base, 'server_inference', 'count'):.0f} and "
        f"{side(cur, 'statuses', '200'):.0f} admitted requests against {side(base, 'statuses', '200'):.0f}. A "
        f"normal client's p50 read {span(quiet)} ms on the quiet server and {span(list(slow.values()))} ms while "
        f"{SLOW_IDLE} idle and {SLOW_TRICKLING} trickling sockets were open (ratio {span(ratios, 2)})."
        + rendered_from(rel)
    )


def _met(ok: bool) -> str:
    return "target met" if ok else "target missed"


def _serve_overhead(d: str) -> str:
    """One serve-overhead report: served minus in-process at one client (two processes, one process, the bare
    server's floor), 32 clients served over in-process b32 (two processes; one process where measured), the
    server's CPU per request against the model's per text, and where a lone request's time goes."""
    rel = f"{d}/report.json"
    r = load(rel)
    st = r["settings"]
    tgt = st["targets"]
    c1, c32, steps = [], [], []
    for v in r["variants"]:
        b, a = v["codes"]["before"], v["codes"]["after"]
        n = v["name"]
        one = v.get("same_process") or {}
        floor = (v.get("floor") or {}).get("overhead_ms")
        in_one = (
            f", {num(one['overhead_ms'])} ms in one process where the bare uvloop + httptools server reads "
            f"{num(floor)} ms (qserve {num(one['overhead_ms'] - floor)} ms above it)"
            if one and floor is not None
            else ""
        )
        c1.append(
            f"{n} {num(b['summary']['overhead_ms'])} -> **{num(a['summary']['overhead_ms'])} ms** "
            f"({_met(a['summary']['overhead_ok'])}) across two processes{in_one}"
        )
        ca = a["served"]["levels"]["32"]
        c32.append(
            f"{n} {ratio(b['summary']['throughput_ratio'])} -> **{ratio(a['summary']['throughput_ratio'])}** "
            f"({_met(a['summary']['throughput_ok'])})"
            + (
                f" across two processes, **{ratio(one['c32_ratio'])}** "
                f"({_met(one['c32_ratio'] >= tgt['throughput_ratio'])}) in one (rounds "
                + " / ".join(num(x["c32_ratio"]) for x in one["rounds"])
                + ")"
                if one.get("c32_ratio")
                else ""
            )
            + f"; server CPU {num(ca['server_cpu_ms_per_req'])} ms per request against "
            f"{num(a['in_process']['b32']['cpu_ms_per_text'])} per text in process, mean batch "
            f"{num(ca['mean_batch'], 1)}"
        )
        us = (v.get("steps") or {}).get("us") or {}
        if us:
            steps.append(
                f"{n}: "
                + ", ".join(
                    f"{k} {us[k]:,.0f}"
                    for k in (
                        "receive",
                        "queue wait",
                        "tokenize",
                        "inference",
                        "hop back",
                        "respond",
                        "outside the spans",
                    )
                    if k in us
                )
            )
    return (
        f"{on(rel)}, {r['created'][:10]}, {st['rounds']} rounds, before = `{st['baseline_ref']}`, after = the "
        f"code of the run; targets <= {tgt['overhead_ms']:g} ms at one client and >= {tgt['throughput_ratio']:g}x "
        f"at 32. **One client**, served p50 minus in-process p50: " + "; ".join(c1) + ". **32 clients**, served "
        "req/s over in-process b32 texts/s: "
        + "; ".join(c32)
        + "."
        + (
            " **A lone request's steps** (the server's own trace spans, median microseconds): " + "; ".join(steps) + "."
            if steps
            else ""
        )
    )


def serve_overhead() -> str:
    return _serve_overhead("serve-overhead")


def serve_overhead_xeon() -> str:
    return _serve_overhead("serve-overhead-xeon")


def serving_lanes() -> str:
    """docs/serving.md: what lanes did at 32 clients, the before / after ratios of the Xeon's serve-overhead run."""
    rel = "serve-overhead-xeon/report.json"
    r = load(rel)
    parts = [
        f"{v['name']} {ratio(v['codes']['before']['summary']['throughput_ratio'])} -> "
        f"{ratio(v['codes']['after']['summary']['throughput_ratio'])}"
        for v in r["variants"]
    ]
    return (
        "At 32 clients on 2 cores, served req/s over the in-process b32 texts/s went "
        + ", ".join(parts)
        + f" with lanes ({on(rel)}, `make reports STAGE=serve-overhead-xeon`)."
    )


def serve_text() -> str:
    """Serving onnx-int8 on short sentences: overhead at one client, what batching buys at 32, against the model."""
    rel = "serve/serve_report.json"
    r = load(rel)
    s, c, st = r["summary"], r["model_ceiling"], r["settings"]
    levels = {(k, lv["concurrency"]): lv for k in ("unbatched", "batched") for lv in r["runs"][k]["levels"]}
    hi = levels[("batched", st["concurrency_high"])]
    mism = sum(lv["mismatched"] for lv in levels.values())
    return (
        f"{on(rel)}, {r['created'][:10]}, {st['duration_s']:g} s per level: {num(s['overhead_c1_ms'])} ms of "
        f"HTTP + queue over the model's own b1 ({num(s['model_b1_p50_ms'])} ms) at concurrency 1; {mism} "
        f"mismatched answers at c1 and c{st['concurrency_high']} with batching on and off; dynamic batching gave "
        f"**{ratio(s['throughput_ratio'])}** throughput at c{st['concurrency_high']} "
        f"({num(s['rps_high_batched'], 1)} vs {num(s['rps_high_unbatched'], 1)} req/s) against a ceiling of "
        f"{ratio(s['ratio_bound'])} that run allowed (the model alone, {num(c['texts_per_s_batched'], 1)} texts/s "
        f"at b{c['batch']}, over the unbatched server), p99 {num(hi['p99_ms'], 0)} ms, "
        f"{num(s['mean_batch_high_batched'], 1)} texts a forward. Served c{st['concurrency_high']} is "
        f"{ratio(s['rps_high_batched'] / c['texts_per_s_batched'])} the model alone at b{c['batch']} (which computed "
        f"{num(c['texts_per_s_b1'], 1)} texts/s at batch 1)."
    )


def serve_protocols() -> str:
    """The same texts through every protocol, alone and concurrently; /v1 c32 new over old."""
    rel = "serve-protocols/report.json"
    r = load(rel)
    a, t = r["answers"], r["throughput"]
    same = all(x[k]["bit_identical"] == a["texts"] for x in a["by_protocol"].values() for k in ("alone", "concurrent"))
    rounds = t["summary"]["rps_ratio_per_round"]
    return (
        f"{on(rel)}: {a['texts']} real reviews through "
        + ", ".join(a["by_protocol"])
        + f", alone and {a['workers']} in flight: "
        + (f"{a['texts']}/{a['texts']} bit-identical on every protocol" if same else "answers differ, see the report")
        + f"; /v1 c{t['concurrency']} new / old ({r['old_ref']}) {ratio(t['summary']['rps_ratio_new_over_old'], 3)} "
        f"median ({span(rounds, 3)} over {t['rounds']} rounds)."
    )


def predict_text() -> str:
    """`qserve predict` over the corpus: rows/s against the in-process ceiling, memory, Ray Data."""
    rel = "predict/report.json"
    r = load(rel)
    loc, ra = r["local"], r["ratios"]
    r1, r2 = r["ray_1_node"], r["ray_2_nodes"]
    return (
        f"{on(rel)}: all {r['rows']:,} reviews with {Path(r['variant']).name} ({r['long_text']}): local "
        f"{num(loc['rows_per_s'], 1)} rows/s = {ratio(ra['local_vs_ceiling'])} the in-process b32 ceiling "
        f"({num(r['ceiling']['rows_per_s'], 1)}), peak RSS {loc['peak_rss_mib']:,.0f} MiB = "
        f"{ratio(ra['rss_big_vs_small'], 3)} the {r['small_rows']:,}-row run; Ray Data on 1 node "
        f"{num(r1['rows_per_s'], 1)} rows/s ({ratio(ra['ray_1_node_vs_local'])} local), a {r2['nodes']}-node "
        f"cluster on this machine {num(r2['rows_per_s'], 1)} rows/s ("
        + " / ".join(f"{n:,}" for n in r2["rows_per_node"].values())
        + " rows per node)."
    )


def _protocol_cost(d: str) -> str:
    rel = f"{d}/report.json"
    r = load(rel)
    b, a = r["median"]["before"], r["median"]["after"]
    rows = [
        [
            TITLES[k],
            num(b[k]["event_loop_cpu_ms_per_req"]),
            f"**{num(a[k]['event_loop_cpu_ms_per_req'])}**",
            num(b[k]["p50_ms"], 1),
            num(a[k]["p50_ms"], 1),
            f"{a[k]['errors']}, {a[k]['label_mismatches_vs_v1']}",
        ]
        for k in ROUTES
        if k in a
    ]
    head = [
        "route",
        f"event-loop CPU ms/req before ({r['baseline_ref']})",
        "after",
        "p50 ms before",
        "after",
        "errors, label mismatches vs /v1",
    ]
    return (
        f"{r['rounds']} rounds of {r['duration_s']:g} s per route at one client, {r['created'][:10]}:\n\n"
        + table(head, rows)
        + rendered_from(rel)
    )


def serve_protocol_cost() -> str:
    return _protocol_cost("serve-protocol-cost")


def serve_protocol_cost_xeon() -> str:
    return _protocol_cost("serve-protocol-cost-xeon")


def serve_buckets() -> str:
    """Length buckets, gRPC and tracing served: ratios of req/s, every server at once, rounds interleaved."""
    rel = "serve-buckets/report.json"
    r = load(rel)
    s, st = r["summary"], r["settings"]

    def cell(x: dict[str, Any] | None) -> str:
        return "–" if not x or x["ratio"] is None else f"{x['ratio']:.2f}x ({span(x['rounds'])})"

    rows = [
        [
            tail.split(" | ")[0],
            tail.split(" | ")[1][1:],
            cell(c["ov_buckets_over_onnx_int8"]),
            cell(c["ov_buckets_over_ov_padded"]),
            cell(c["grpc_over_http"]),
            cell(c["tracing_off_over_baseline"]),
        ]
        for tail, c in s["comparisons"].items()
    ]
    head = [
        "texts",
        "conc",
        "ov-int8 buckets / onnx-int8",
        "ov-int8 buckets / ov-int8 padded",
        "gRPC / HTTP (ov-int8)",
        f"onnx-int8 today / at {st['baseline_ref']}",
    ]
    return (
        f"{st['rounds']} interleaved rounds of {st['duration_s']:g} s per cell, threads {st['threads']}; errors / "
        f"lost / mismatched answers over every cell: {s['errors']} / {s['lost']} / {s['mismatched']}. Ratios of "
        "req/s (per-round range in brackets):\n\n" + table(head, rows) + rendered_from(rel)
    )


def lifecycle() -> str:
    """Several models per server: shadowing's throughput cost, a hot swap's latency and memory."""
    rel = "lifecycle/report.json"
    r = load(rel)
    s, st, sh = r["summary"], r["settings"], r["shadow_state"]
    during = [x["latency"]["during"]["p99_ms"] for x in r["swap_rounds"]]
    return (
        f"{on(rel)}, {r['created'][:10]}: shadowing at rate {st['shadow_rate']:g} costs "
        f"**{pct(s['shadow_cost'], 1)}** of the throughput at {st['concurrency']} clients "
        f"({num(s['rps_plain'], 1)} vs {num(s['rps_shadowed'], 1)} req/s, {sh['samples']:,} texts re-scored, "
        f"{sh['dropped']} dropped, rolling agreement {pct(sh['agreement'], 0)}); a hot swap "
        f"({num(s['swap_load_s'])} s to load, warm, switch and release) moves p99 at {st['swap_concurrency']} "
        f"clients from {num(s['swap_p99_before_ms'], 1)} to {num(s['swap_p99_during_ms'], 1)} ms while it runs "
        f"({span(during, 0)} ms over the {len(during)} swaps), with {s['errors']} errors and "
        f"{s['other_versions']} answers naming a version other than the old or the new; server RSS "
        f"{s['rss_before_mb']:,.0f} MiB before, {s['rss_peak_during_mb']:,.0f} at the peak, "
        f"{s['rss_after_mb']:,.0f} after."
    )


def serve_ray_sizing() -> str:
    """docs/serving.md's cost and sizing: Ray Serve's proxy hop, one replica against uvicorn, per-replica rates."""
    rel = "serve-ray/report.json"
    r = load(rel)
    s, cells = r["summary"], r["summary"]["cells"]
    triv = s["trivial_c32-t1"]
    hop = triv["ms_per_request_ray"] - triv["ms_per_request_uvicorn"]
    per2, per1 = cells["ray-1"]["c32-t1"]["rps"], cells["ray-2"]["c32-t1"]["rps"] / 2
    diff = max(c["max_score_diff"] for e in cells.values() for c in e.values())
    return (
        f"({on(rel)}, quiet, one interleaved run, onnx-int8 row by row on real reviews): every engine answers "
        f"every text identically (max score difference {diff:g}). Ray's proxy hop costs {num(hop, 1)} ms of CPU "
        f"per request (trivial app: {num(triv['ray_rps'], 0)} vs {num(triv['uvicorn_rps'], 0)} req/s under plain "
        f"uvicorn at c32). At concurrency 32, one Ray replica keeps {num(s['ray1_over_uvicorn_c32-t1'])} of "
        f"uvicorn's throughput with 1 text per request and {num(s['ray1_over_uvicorn_c32-t32'])} with 32; at "
        f"concurrency 1, {num(s['ray1_over_uvicorn_c1-t1'])} (the hop's latency). Measured here: "
        f"{num(per2, 0)} req/s per 2-core replica ({num(per1, 0)} per 1-core replica) at c32, plus the hop's "
        f"{num(hop, 1)} ms of proxy CPU per request."
    )


def image() -> str:
    """docs/deploy.md: the images' sizes, start to ready, the toolkit's run and the serving profile's fresh venv."""
    rel = "image/report.json"
    r = load(rel)
    s, bars = r["serve_image"], r["bars"]
    heavy = ", ".join(s["heavy"]) if s["heavy"] else "none of " + ", ".join(s["heavy_checked"])
    out = [
        f"{on(rel)}, {r['created'][:10]} (docker {r['docker']}, base `{s.get('base') or 'not recorded'}`"
        f"{'; ' + r['note'] if r.get('note') else ''}): the serving image is **{num(s['size_mb'], 0)} MB** "
        f"(`docker image inspect` Size; the bar {bars['serve_image_mb']} MB), with "
        f"{heavy} importable"
        + (
            f", and the bytecode of what a serving start imports ({s['bytecode']['files']} .pyc files, "
            f"{num(s['bytecode']['mb'], 1)} MB of it)."
            if "bytecode" in s
            else "."
        )
    ]
    if "start_to_ready" in r:
        t = r["start_to_ready"]
        phases = t.get("phases_median_s", {})
        out.append(
            f"Container start to ready (`docker run` to `/ready` 200 polled every {num(t.get('polled_every_s'))} s, "
            f"{t['variant']}, read-only root and mount, `--threads {t['threads']}`"
            + (f", CPU weight {t['cpu_weight']}" if t.get("cpu_weight") else "")
            + "): median "
            f"**{num(t['median_s'])} s**, {num(t.get('min_s'))} to {num(t['max_s'])} s over {len(t['seconds'])} "
            f"starts (the bar {num(bars['start_to_ready_s'], 0)} s)"
            + (
                ": " + ", ".join(f"{PHASE_NAMES.get(k, k)} {num(v)} s" for k, v in phases.items()) + " (medians)."
                if phases
                else "."
            )
        )
        if "imports" in t:
            top = ", ".join(f"{k} {num(v)}" for k, v in list(t["imports"]["by_package_s"].items())[:5])
            out.append(
                f"Its imports take {num(t['imports']['total_s'])} s in all (by package, s: {top}; one more start, "
                f"profiled), and {t['imports']['compiled_at_start']} module(s) compiled from source during the start."
            )
    if "venv_start_to_ready" in r:
        v = r["venv_start_to_ready"]
        out.append(
            f"The same dir served from this checkout's venv (the full toolkit, torch beside it), interleaved: median "
            f"{num(v['median_s'])} s ({num(v['min_s'])} to {num(v['max_s'])} s)."
        )
    if "machine" in r:
        m = r["machine"]
        out.append(
            f"Load average {num(m['load_average_before'][0])} when the starts began, {num(m['load_average_after'][0])} "
            f"when they ended (on {m['cores']} cores)."
        )
    if "toolkit_run" in r:
        k, steps = r["toolkit_run"], r["toolkit_run"]["steps"]
        done = ", ".join(f"{name} {num(v['seconds'], 0)} s (exit {v['exit']})" for name, v in steps.items())
        out.append(
            f"The toolkit image ({num(r['toolkit_image']['size_mb'], 0)} MB) ran train ({k['max_samples']} samples) "
            f"-> export onnx-int8 -> bench: {done}{_measured(k)}."
        )
    if "toolkit_pipeline" in r:
        k = r["toolkit_pipeline"]
        out.append(
            f"`qserve pipeline` in the toolkit image (onnx-int8, {k['argv'][k['argv'].index('--max-samples') + 1]} "
            f"training samples) {'wrote its report' if k['ok'] else 'failed'} in {num(k['seconds'], 0)} s "
            f"(exit {k['exit']}){_measured(k)}."
        )
    if "fresh_venv" in r:
        v = r["fresh_venv"]
        out.append(
            f"`pip install 'qserve[serve]'` in a fresh venv: {v['packages']} packages, "
            f"{'no torch' if not v['heavy_installed'] else 'with ' + ', '.join(v['heavy_installed'])}; its "
            f"`qserve serve` answered /v1/classify on the onnx-int8 dir with HTTP {v['classify_status']}{_measured(v)}."
        )
    return " ".join(out) + rendered_from(rel)


def _measured(section: dict[str, Any]) -> str:
    """Where a section of the image report was carried from an earlier run: when and at which commit it ran."""
    m = section.get("measured")
    return f" (measured {m['created'][:10]} at commit `{m['commit'][:12]}`)" if m else ""


PHASE_NAMES = {
    "create_start": "container create and start",
    "python_imports_cli": "Python, imports and flags",
    "app_start": "app and server start",
    "model_load": "model load",
    "warm_up": "warm-up",
    "first_ready": "to the first 200",
}
"""benchmarks/image_report.py's PHASES, in words."""
