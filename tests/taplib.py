"""TAP for the Python test scripts that run the command (test_ep_layout.py,
test_layouts.py): check(desc, fn) runs one check and records it (an
exception is its failure, reported with its message), dl(*args, want=0)
runs `dropless` and fails unless it exits with want, finish() prints the
plan and the results and exits 0 (the TAP lines carry the verdicts)."""
import os
import subprocess
import sys

DL = os.path.join(os.environ.get("top_builddir", "."), "dropless")
results = []


def check(desc, fn):
    try:
        fn()
        results.append((True, desc, ""))
    except Exception as e:  # a failed check, reported and counted
        results.append((False, desc, "%s: %s" % (type(e).__name__, e)))


def dl(*args, want=0):
    p = subprocess.run([DL] + list(args), capture_output=True, text=True)
    if p.returncode != want:
        raise AssertionError("exit %d, want %d: dropless %s\n%s%s" %
                             (p.returncode, want, " ".join(args), p.stdout, p.stderr))
    return p


def finish():
    print("1..%d" % len(results))
    for i, (ok, desc, why) in enumerate(results, 1):
        print("%s %d - %s" % ("ok" if ok else "not ok", i, desc))
        for line in why.splitlines():
            print("# " + line)
    sys.exit(0)
