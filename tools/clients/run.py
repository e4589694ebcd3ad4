"""The transformers clients harness: every MoE block of clients.CLIENTS on
every golden case it can express, in fp32, bf16 and fp16, on the CPU;
two candidates per run (`chained`: every stage the block exposes;
`fused`: out and d_x only), each judged by `dropless check`; the verdicts
compared with the expectations (expected.tsv beside this file).

Usage: python3 tools/clients/run.py --dropless PATH/dropless --vectors DIR -o OUTDIR
           [--clients NAME,...] [--cases NAME,...] [--golden FILE ...] [--table FILE]
           [--device cpu|cuda] [--jobs N]

--device cuda runs the blocks on the GPU (doc/conformance/h200_run.sh,
part clients); --jobs N runs N `dropless check`s at once (each on one
thread), for a machine with the cores to spare.
Exit status: 0 when every verdict is the expected one, 1 otherwise (the
unexpected rows are listed), 2 on bad usage (a client, case or file that
does not exist).

Run through `make check-clients` (mk/clients.am), which makes the venv
(tools/clients/setup_venv.sh) and points PYTHONPATH at python/ (the
goldens are read by `dropless.load`, the candidates written by
`dropless.write_candidate`).
"""

import argparse
import fnmatch
import json
import os
import subprocess
import sys
import time
import traceback

import numpy as np

# HDF5's flock on the candidates: a `dropless check` forked from a pool
# thread while the main thread had a candidate open inherits the lock, and
# declare_storage's 'r+' open then failed (EAGAIN, 2 of 1392 candidates on
# the H200 machine). The harness is its files' only writer.
os.environ.setdefault("HDF5_USE_FILE_LOCKING", "FALSE")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import clients as C  # noqa: E402

# the vector-tier cases, each in its three dtypes
CASES = ("tiny", "ties", "ties-grouped", "empty-experts", "no-tokens", "one-hot", "single-token",
         "odd-shapes", "zipf", "mixtral-small", "deepseek-v3-small", "grouped-max", "plain-ffn")
# cases the branches ffn, route and shared add to the catalogue: run where
# their golden files are present (after the merge), skipped, saying so, before
OPTIONAL_CASES = ("qwen2-moe-like", "deepseek-v3-shared", "gpt-oss-like", "softmax-topk",
                  "softmax-topk-ties")
# the FFN variants' families and gpt-oss with every feature on
OPTIONAL_CASES += ("swiglu-clamp-tight", "geglu-tanh", "nemotron-like", "deepseek-v4-like",
                   "gpt-oss-full", "nemotron-shared")
# the routing variants of issue 26: Llama-4's score on the input, hash routing
OPTIONAL_CASES += ("llama4-like", "deepseek-v4-hash", "longcat-like")
DTYPES = ("fp32", "bf16", "fp16")
CANDIDATES = ("chained", "fused")
# one thread for dropless check: the cases are small, and OpenMP's waiting
# threads on a loaded machine made a 0.03 s check take 11 s of wall time
ONE_THREAD = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
FUSED_STAGES = ("out", "d_x")
# rows whose block the installed transformers lacks: no candidate, no
# verdict on the mapping (said once per client, never UNEXPECTED)
NOT_AVAILABLE = "NOT AVAILABLE"
NO_RUN = ("NOT EXPRESSIBLE", NOT_AVAILABLE)


def case_file(vectors, case, dtype):
    return os.path.join(vectors, case + ("" if dtype == "fp32" else "-" + dtype) + ".h5")


def load_expected(path):
    """[(client glob, case glob, dtype glob, candidate glob, verdict, why)]
    from the tab-separated expectations; the first matching row wins, and
    a run no row matches is expected CONFORMANT."""
    rows = []
    with open(path) as fh:
        for n, line in enumerate(fh, 1):
            line = line.rstrip("\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            parts = line.split("\t")
            if len(parts) != 6:
                raise SystemExit("%s:%d: expected 6 tab-separated fields, got %d"
                                 % (path, n, len(parts)))
            rows.append(tuple(p.strip() for p in parts))
    return rows


def expected_for(rows, client, case, dtype, cand):
    for c, k, d, m, verdict, why in rows:
        if all(v == p or fnmatch.fnmatchcase(v, p) for v, p in ((client, c), (case, k),
                                                                (dtype, d), (cand, m))):
            return verdict, why
    return "CONFORMANT", ""


def check(dropless, golden, cand, report):
    """Runs `dropless check` and returns (verdict, worst err_pass, worst
    stage, WARN rows, exit status)."""
    p = subprocess.run([dropless, "check", "--force", "--json", report, golden, cand],
                       capture_output=True, text=True, timeout=600, env=ONE_THREAD)
    if p.returncode not in (0, 1) or not os.path.exists(report):
        msg = (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1]
        verdict = "NOTHING CHECKED" if "nothing to check" in msg else "ERROR"
        return verdict, None, "-", [msg], p.returncode
    with open(report) as fh:
        rep = json.load(fh)
    worst, where, warns = 0.0, "-", []
    for row in rep["checks"]:
        e = row.get("err_pass")
        if row["check"] == "numerics" and e is not None and e > worst:
            worst, where = e, row["stage"]
        if row["verdict"] in ("WARN", "FAIL"):
            warns.append("%s %s %s" % (row["stage"], row["check"], row["verdict"]))
    verdict = "CONFORMANT" if rep["conformant"] else "NOT CONFORMANT"
    return verdict, worst, where, warns, p.returncode


def run_one(client, golden_path, outdir, dropless, torch, dropless_pkg, profile_for, version,
            device, pool):
    """Builds, runs (on `device`) and writes both candidates of one client
    on one golden file and submits their checks to `pool` (an Executor):
    [row dict] (one per candidate), their verdicts filled by finish()."""
    g = dropless_pkg.load(golden_path)
    case, dtype = g.case, g.config["dtype"]
    base = {"client": client.name, "case": base_case(case, dtype), "dtype": dtype,
            "golden": golden_path}
    try:
        block = C.build(client, dict(g.config), torch)
        C.load_inputs(client, block, g, torch)
        block.to(device)  # the parameters keep their dtypes
        t0 = time.time()
        outputs = C.run_block(client, block, g, torch, device)
        secs = time.time() - t0
    except C.NotExpressible as e:
        return [dict(base, candidate=m, verdict="NOT EXPRESSIBLE", why=str(e)) for m in CANDIDATES]
    except C.NotAvailable as e:
        return [dict(base, candidate=m, verdict=NOT_AVAILABLE, why=str(e)) for m in CANDIDATES]
    except Exception as e:  # the client itself failed: no candidate
        why = "%s: %s" % (type(e).__name__, str(e).strip().splitlines()[-1] if str(e) else "")
        return [dict(base, candidate=m, verdict="ERROR", why=why, worst=None, worst_stage="-",
                     traceback=traceback.format_exc()) for m in CANDIDATES]
    have = set(g.stages())
    pairs = gate_up_pairs()
    unknown = sorted(n for n in outputs
                     if n not in have and not set(pairs.get(n, ("-",))) <= have)
    if unknown:  # a mapping reading a stage this catalogue does not define
        raise RuntimeError("%s: stages the golden does not have: %s" % (client.name, unknown))
    rows = []
    for mode in CANDIDATES:
        outs = outputs if mode == "chained" else {s: outputs[s] for s in FUSED_STAGES}
        stem = "%s--%s--%s" % (case, "".join(ch if ch.isalnum() or ch in "._-" else "_"
                                              for ch in client.name), mode)
        cand = os.path.join(outdir, stem + ".h5")
        dropless_pkg.write_candidate(cand, outs, g, backend="transformers:" + client.name,
                                     compute_mode=profile_for(dtype), force=True,
                                     backend_version=version, device=device)
        declare_storage(cand, outs, g, torch)
        args = (dropless, golden_path, cand, os.path.join(outdir, stem + ".json"))
        rows.append(dict(base, candidate=mode, stages=sorted(outs), seconds=round(secs, 3),
                         profile=profile_for(dtype), device=device,
                         pending=pool.submit(check, *args)))
    g.close()
    return rows


def finish(row):
    """Fills a row's verdict from its check's Future (rows that never got
    to a check, NOT EXPRESSIBLE or ERROR, have their verdict already)."""
    p = row.pop("pending", None)
    if p is None:
        return row
    verdict, worst, where, warns, rc = p.result()
    row.update(verdict=verdict, worst=worst, worst_stage=where, warns=warns, why="; ".join(warns))
    return row


def gate_up_pairs():
    """{interleaved key: (gate stage, up stage)}: a key such as gpt-oss's
    d_w_gate_up names two stages (dropless.write_candidate splits it)."""
    return sys.modules["dropless.check"].GATE_UP


def declare_storage(path, outs, g, torch):
    """Labels each float stage the block stored coarser than the case's type
    for it (bf16 gradients of bf16 parameters in an fp32-typed stage) with
    its own grid, the `dtype` attribute of doc/format.md, "Storage types":
    the checker then judges it at that precision with a NOTE, as it does
    when it infers the grid, which it can only from 8 nonzero values."""
    import h5py
    grid = {torch.bfloat16: "bf16", torch.float16: "fp16"}
    with h5py.File(path, "r+") as f:
        for key, t in outs.items():
            label = grid.get(getattr(t, "dtype", None))
            for name in gate_up_pairs().get(key, (key,)):
                if label is None or g.dtype_of(name) != "fp32":
                    continue
                for grp in ("forward", "backward"):
                    if grp in f and name in f[grp]:
                        f[grp][name].attrs["dtype"] = np.bytes_(label.encode())


def profile_for(dtype):
    """As the PyTorch adapter declares it: bf16/fp16 operands with fp32
    accumulation and autograd summing stored parts (-acc); fp32 on the CPU."""
    return dtype + "-acc" if dtype in ("bf16", "fp16") else "fp32"


def base_case(case, dtype):
    """The catalogue case without its dtype suffix (mixtral-small-bf16 ->
    mixtral-small), the table's row."""
    suffix = "-" + dtype
    return case[:-len(suffix)] if dtype != "fp32" and case.endswith(suffix) else case


def fmt(x):
    return "-" if x is None else ("%.3g" % x)


def table(rows):
    """The markdown table: client x case, one column per dtype, each cell
    the chained and the fused verdict with their worst figures."""
    cell = {}
    for r in rows:
        cell.setdefault((r["client"], r["case"]), {}).setdefault(r["dtype"], {})[r["candidate"]] = r
    out = ["| client | case | fp32 (chained / fused) | bf16 (chained / fused) | "
           "fp16 (chained / fused) |", "|---|---|---|---|---|"]
    short = {"CONFORMANT": "C", "NOT CONFORMANT": "**NC**", "ERROR": "**ERROR**",
             "NOTHING CHECKED": "nothing checked"}
    for (client, case), by_dt in cell.items():
        if all(r["verdict"] in NO_RUN for m in by_dt.values() for r in m.values()):
            continue
        cols = []
        for dt in DTYPES:
            m = by_dt.get(dt, {})
            if not m:
                cols.append("")
                continue
            parts = []
            for mode in CANDIDATES:
                r = m.get(mode)
                if r is None:
                    continue
                if r["verdict"] in NO_RUN:
                    parts.append("n/e" if r["verdict"] == "NOT EXPRESSIBLE" else "n/a")
                    continue
                flag = "" if r.get("as_expected", True) else " (UNEXPECTED)"
                parts.append("%s %s (%s)%s" % (short.get(r["verdict"], r["verdict"]),
                                               fmt(r.get("worst")), r.get("worst_stage", "-"),
                                               flag))
            cols.append(" / ".join(parts))
        out.append("| %s | %s | %s |" % (client, case, " | ".join(cols)))
    return "\n".join(out) + "\n"


def not_expressible(rows):
    """One line per client that expresses no case (why: its first reason)
    and per client the installed transformers lacks."""
    by = {}
    for r in rows:
        by.setdefault(r["client"], []).append(r)
    out = []
    for client, rs in by.items():
        na = [r for r in rs if r["verdict"] == NOT_AVAILABLE]
        if na:
            out.append("- `%s`: not available here: %s" % (client, na[0]["why"]))
        elif all(r["verdict"] == "NOT EXPRESSIBLE" for r in rs):
            out.append("- `%s`: not expressible on this branch: %s" % (client, rs[0]["why"]))
    return out


def judge(r, expected, bad):
    """Sets the row's expected verdict and whether it met it (appending it
    to bad if not), and prints it when it ran."""
    want, why = expected_for(expected, r["client"], r["case"], r["dtype"],
                             r["candidate"])
    if r["verdict"] == NOT_AVAILABLE:
        want = NOT_AVAILABLE  # the installed transformers, not the mapping
    elif r["verdict"] == "NOT EXPRESSIBLE" and want != "NOT EXPRESSIBLE":
        # the case filter refused this case: expected, as long as
        # the client expresses some case (checked below)
        want = "NOT EXPRESSIBLE"
    elif r["verdict"] != "NOT EXPRESSIBLE" and want == "NOT EXPRESSIBLE":
        # a waiting mapping whose variant the catalogue now has
        # (a branch merged): from now on it must conform
        want = "CONFORMANT"
    r["expected"], r["expected_why"] = want, why
    r["as_expected"] = r["verdict"] == want
    if not r["as_expected"]:
        bad.append(r)
    if r["verdict"] not in NO_RUN:
        print("%-34s %-22s %-5s %-8s %-15s worst %7s x PASS (%s)%s%s" % (
            r["client"], r["case"], r["dtype"], r["candidate"], r["verdict"],
            fmt(r.get("worst")), r.get("worst_stage", "-"),
            ("  " + r["why"]) if r["verdict"] in ("ERROR", "NOTHING CHECKED") else "",
            "" if r["as_expected"] else "  UNEXPECTED (expected %s)" % want),
            flush=True)


def golden_files(a):
    """The golden files a run takes: --cases (default: the vector tier and
    the optional cases present) in each of --dtypes, then --golden."""
    cases = CASES if a.cases is None else [c for c in a.cases.split(",") if c]
    goldens = [case_file(a.vectors, c, dt) for c in cases for dt in a.dtypes.split(",")]
    if a.cases is None:
        absent = [c for c in OPTIONAL_CASES if not os.path.isfile(case_file(a.vectors, c, "fp32"))]
        if absent:
            print("clients: not in this catalogue (yet): %s" % " ".join(absent))
        goldens += [case_file(a.vectors, c, dt) for c in OPTIONAL_CASES if c not in absent
                    for dt in a.dtypes.split(",")]
    return goldens + a.golden


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dropless", required=True, help="the dropless command")
    ap.add_argument("--vectors", required=True, help="the directory of the golden files")
    ap.add_argument("-o", "--outdir", required=True, help="candidates and reports go here")
    ap.add_argument("--clients", help="comma-separated client names (default: all)")
    ap.add_argument("--cases", help="comma-separated case names (default: the vector tier; "
                    "'' for none, with --golden)")
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--golden", nargs="*", default=[], help="further golden files (any case)")
    ap.add_argument("--expected", default=os.path.join(HERE, "expected.tsv"))
    ap.add_argument("--table", help="write the markdown table here")
    ap.add_argument("--jsonl", help="write one JSON line per row here")
    ap.add_argument("--device", default="cpu", help="where the blocks run (cpu, cuda)")
    ap.add_argument("--jobs", type=int, default=1, help="dropless checks run at once")
    a = ap.parse_args(argv)
    if a.jobs < 1:
        print("clients: --jobs must be at least 1", file=sys.stderr)
        return 2
    try:
        chosen = [C.by_name(n) for n in a.clients.split(",")] if a.clients else C.CLIENTS
    except KeyError as e:
        print("clients: %s" % e.args[0], file=sys.stderr)
        return 2
    goldens = golden_files(a)
    missing = [p for p in goldens if not os.path.isfile(p)]
    if missing:
        print("clients: %s: no such golden file" % missing[0], file=sys.stderr)
        return 2
    if not os.access(a.dropless, os.X_OK):
        print("clients: %s: not an executable dropless" % a.dropless, file=sys.stderr)
        return 2
    expected = load_expected(a.expected)
    import warnings
    import torch
    import transformers
    import dropless
    transformers.logging.set_verbosity_error()  # the configs' token ids, unused here
    warnings.filterwarnings("ignore", message="Initializing zero-element tensors")  # width 0
    torch.manual_seed(0)
    torch.set_num_threads(1)  # the machine is shared; the blocks are small
    if a.device != "cpu" and not torch.cuda.is_available():
        print("clients: --device %s: torch sees no GPU" % a.device, file=sys.stderr)
        return 2
    version = "transformers %s, torch %s" % (transformers.__version__, torch.__version__)
    if a.device != "cpu":
        version += ", %s" % torch.cuda.get_device_name()
    os.makedirs(a.outdir, exist_ok=True)
    import concurrent.futures
    pool = concurrent.futures.ThreadPoolExecutor(a.jobs)
    runs = []
    for client in chosen:
        for gp in goldens:
            try:
                got = run_one(client, gp, a.outdir, a.dropless, torch, dropless, profile_for,
                              version, a.device, pool)
            except Exception as e:  # one failing run must not stop the others
                got = [dict(client=client.name, case=os.path.basename(gp), dtype="?",
                            candidate=m, verdict="ERROR", why="%s: %s" % (type(e).__name__, e),
                            traceback=traceback.format_exc()) for m in CANDIDATES]
            runs.append((client, got))
    rows, bad = [], []
    for client in chosen:
        for r in (r for c, got in runs if c is client for r in got):
            finish(r)
            judge(r, expected, bad)
            rows.append(r)
        mine = [r for r in rows if r["client"] == client.name]
        waiting = expected_for(expected, client.name, "*", "*", "*")[0] == "NOT EXPRESSIBLE"
        if a.cases is None and mine and not waiting and \
                all(r["verdict"] in NO_RUN for r in mine) and \
                not any(r["verdict"] == NOT_AVAILABLE for r in mine):
            r = dict(mine[0], verdict="NOTHING EXPRESSED", expected="CONFORMANT somewhere",
                     as_expected=False)
            bad.append(r)  # a mapping that refuses every case tests nothing
    if a.jsonl:
        with open(a.jsonl, "w") as fh:
            for r in rows:
                fh.write(json.dumps(r, default=str) + "\n")
    if a.table:
        with open(a.table + ".tmp", "w") as fh:
            fh.write(table(rows))
            fh.write("\n" + "\n".join(not_expressible(rows)) + "\n")
        os.replace(a.table + ".tmp", a.table)
    ran = [r for r in rows if r["verdict"] not in NO_RUN]
    counts = {}
    for r in ran:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    na = sum(r["verdict"] == NOT_AVAILABLE for r in rows)
    print("clients: %d candidates checked (%s); %d runs not expressible; %s%d unexpected" % (
        len(ran), ", ".join("%d %s" % (n, v) for v, n in sorted(counts.items())),
        len(rows) - len(ran) - na, "%d runs not available in %s; " % (na, version) if na else "",
        len(bad)))
    for line in not_expressible(rows):
        print(line)
    for r in bad:
        print("UNEXPECTED: %s %s %s %s: %s, expected %s %s" % (
            r["client"], r["case"], r["dtype"], r["candidate"], r["verdict"], r["expected"],
            r.get("why", "")))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
