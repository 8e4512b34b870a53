#!/usr/bin/env bash
# Run scripts/gpu_run.sh detached from the command that starts it, so that one runner process
# goes on across several device commands of at most 10 minutes each: no notebook is cut at a
# command's end to be redone by the next, and the runner's start-up (~25 s) is paid once.
#   bash scripts/gpu_detached.sh start <run-id> <wait-seconds> <budget-seconds> <step>...
#   bash scripts/gpu_detached.sh wait <run-id> <wait-seconds>
# `start` launches the run, then waits like `wait`: until the run ends or wait-seconds pass. Each
# prints the runner's new lines and leaves the run folder in $OUT/run.tgz (split into
# run.tgz.N above 15 MB): the runner's own pack once it has finished, else a snapshot of the
# points written so far. A device node kills what a command leaves running unless it started a
# new session (setsid here), and goes back soon after a command ends: so follow `start` with
# `wait` commands back to back, each ending well inside the device time left.
set -u
cmd=$1; rid=$2; wait_s=$3; shift 3
out=${OUT:-.}
home=${TMPDIR:-/tmp}/tunebook-detached/$rid
tree=$home/tree

running() { [[ -s $home/pid ]] && kill -0 "$(cat "$home/pid")" 2>/dev/null; }

pack() {  # <archive> <folder> <name>: a tar.gz of folder/name, split into 15 MB parts if larger
  rm -f "$1" "$1".*; mkdir -p "$2/$3"
  tar czf "$1" -C "$2" "$3" 2>/dev/null  # a point file written meanwhile may warn; it is atomic
  if (( $(stat -c %s "$1") > 15000000 )); then split -b 15000000 -d -a 1 "$1" "$1." && rm "$1"; fi
}

case $cmd in
  start)
    if running; then echo "[detached] $rid is already running (pid $(cat "$home/pid"))"; exit 1; fi
    rm -rf "$home" && mkdir -p "$tree" "$home/out"
    # A private copy of the checkout: the next command brings a fresh copy of the working tree,
    # which must not change files under a running runner.
    tar --exclude=./.gpu --exclude=./.git -cf - . | tar -xf - -C "$tree"
    (
      cd "$tree" || exit 1
      export OUT=$home/out PYTHONPATH=$tree/lib${PYTHONPATH:+:$PYTHONPATH}
      # shellcheck disable=SC2016  # $$ is the detached shell's own pid
      setsid bash -c 'echo $$ > "$0"; exec bash scripts/gpu_run.sh "$@"' "$home/pid" "$rid" "$@" \
        > "$home/log" 2>&1 < /dev/null &
    )
    for _ in 1 2 3 4 5 6 7 8 9 10; do [[ -s $home/pid ]] && break; sleep 0.2; done
    echo "[detached] $rid started (pid $(cat "$home/pid" 2>/dev/null)): bash scripts/gpu_run.sh $rid $*"
    ;;
  wait)
    if [[ ! -d $home ]]; then echo "[detached] no run $rid on this node (it went back?)"; exit 1; fi
    ;;
  *) echo "usage: gpu_detached.sh start|wait <run-id> <wait-seconds> [<budget-seconds> <step>...]"; exit 2 ;;
esac

deadline=$(( $(date +%s) + wait_s ))
while running && (( $(date +%s) < deadline )); do sleep 2; done
seen=$(cat "$home/seen" 2>/dev/null || echo 0)
total=$(wc -l < "$home/log")
tail -n +"$((seen + 1))" "$home/log" | tail -60
echo "$total" > "$home/seen"
if running; then
  pack "$out/run.tgz" "$tree/runs" "$rid"
  echo "[detached] $rid still running; snapshot packed"
else
  cp "$home/out"/run.tgz* "$out"/ 2>/dev/null || pack "$out/run.tgz" "$tree/runs" "$rid"
  echo "[detached] $rid finished"
fi
