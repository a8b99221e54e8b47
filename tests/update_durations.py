"""Write tests/durations.json (seconds per test file, heaviest first) from the output of a
full run with per-test durations, which tests/conftest.py uses to start heavy files first:

    make test PYTEST_ARGS="--durations=0" 2>&1 | tee /tmp/suite.log
    python tests/update_durations.py /tmp/suite.log
"""
import collections
import json
import os
import re
import sys

LINE = re.compile(r"^([0-9.]+)s (?:call|setup|teardown)\s+(\S+?)::")


def main(log: str) -> None:
    seconds: dict[str, float] = collections.defaultdict(float)
    with open(log) as f:
        for line in f:
            m = LINE.match(line)
            if m:
                seconds[m.group(2)] += float(m.group(1))
    if not seconds:
        sys.exit(f"{log}: no per-test durations (run pytest with --durations=0)")
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "durations.json")
    with open(out, "w") as f:
        json.dump({k: round(v) for k, v in sorted(seconds.items(), key=lambda kv: -kv[1])}, f, indent=0)
        f.write("\n")
    print(f"{out}: {len(seconds)} files, {sum(seconds.values()):.0f} s")


if __name__ == "__main__":
    main(sys.argv[1])
