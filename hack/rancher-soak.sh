#!/usr/bin/env bash
# The Rancher route under randomized endings (harvesteradapter, Ginkgo label rancher-soak)
# for SEEDS seeds from SEED_BASE, split over JOBS test processes (each starts its own API
# servers; one seed uses about two thirds of a core). Ginkgo's own suite timeout (1 hour by
# default) is lifted: a process of 100 seeds runs about two hours on 2 cores, and the
# default killed it mid-seed. Each process's whole output goes to
# bin/rancher-soak/<job>.log; a line per seed and a summary are printed; a failed seed's
# history is in its process's log (SOAK_OUT sets the directory) and in $TMPDIR/rancher-soak/seed-<seed>-failed-<start>.log.
set -uo pipefail
seeds=${SEEDS:-100}
base=${SEED_BASE:-1}
jobs=${JOBS:-2}
go=${GO:-go}
out=${SOAK_OUT:-bin/rancher-soak}
mkdir -p "$out"
"$go" test -c -o "$out/harvesteradapter.test" ./harvesteradapter || exit 1
# The processes run in harvesteradapter/: the binary by its absolute path (SOAK_OUT may be
# relative or absolute).
bin="$(cd "$out" && pwd)/harvesteradapter.test"
per=$(( (seeds + jobs - 1) / jobs ))
end=$(( base + seeds ))
pids=()
for (( j = 0; j < jobs; j++ )); do
	from=$(( base + j * per ))
	(( from >= end )) && break
	n=$per
	(( from + n > end )) && n=$(( end - from ))
	( cd harvesteradapter && SAFETY_SEEDS=$n SAFETY_SEED_BASE=$from \
		"$bin" -test.run '^TestHarvesterAdapter$' -test.v -test.timeout 0 \
		-ginkgo.label-filter=rancher-soak -ginkgo.timeout=24h ) > "$out/$j.log" 2>&1 &
	pids+=("$!")
	echo "rancher-soak: seeds $from to $(( from + n - 1 )) in $out/$j.log"
done
rc=0
for p in "${pids[@]}"; do
	wait "$p" || rc=1
done
# Ginkgo's progress marks may precede a seed's line: its words are taken wherever they are.
lines=$(grep -aoh 'rancher-soak seed [0-9]* \(passed\|failed\) .*' "$out"/[0-9]*.log | sort -k3,3n)
echo "$lines"
passed=$(grep -c ' passed ' <<<"$lines")
failed=$(grep -c ' failed ' <<<"$lines")
echo "rancher-soak: $passed seed(s) passed, $failed failed, of $seeds"
if (( failed > 0 || passed != seeds )); then
	rc=1
fi
exit $rc
