#!/bin/bash
# Instructions of bench/read_instructions.py's reads, with redis_stats from $1 (a checkout: the
# directory holding redis_stats/; it needs bench/scrape_full.py too). $2: a tag for the output file.
# Usage: bench/read_instructions.sh /path/to/checkout old; bench/read_instructions.sh . new
set -e
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$1" && pwd)
out=/tmp/read_instructions.$2.$$.out
python=${PYTHON:-python}
coproc P { valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=$out \
    "$python" "$here/read_instructions.py" "$root" 2>/dev/null; }
read -r -u "${P[0]}" line
pid=$(pgrep -f "callgrind-out-file=$out" | head -1)
callgrind_control -i on "$pid" >/dev/null 2>&1
echo go >&"${P[1]}"
read -r -u "${P[0]}" line
callgrind_control -i off "$pid" >/dev/null 2>&1
echo go >&"${P[1]}"
wait
echo "$2 ($root): $(grep -h '^totals' "$out"* | cut -d' ' -f2) instructions"
rm -f "$out"*
