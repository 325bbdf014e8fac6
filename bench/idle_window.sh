#!/bin/bash
# usage: bench/idle_window.sh LOG cmd...
# The measurement window used for the CPU figures in README.md: runs cmd with every other python
# process on the machine paused (SIGSTOP; a watcher also pauses python processes that start
# during the window), resumes them after (also on error or Ctrl-C). Appends the load average and
# the top runnable processes before and after to LOG. IDLE_SETTLE seconds (default 8) of quiet
# first. Only for a machine you own: it pauses other people's jobs too.
LOG=$1; shift
export MEASURE_WINDOW=1
stopped=/tmp/idle_stopped.$$
: > $stopped
watch() {
  while true; do
    for p in $(pgrep python); do
      grep -qz MEASURE_WINDOW=1 /proc/$p/environ 2>/dev/null && continue
      st=$(awk '{print $3}' /proc/$p/stat 2>/dev/null)
      if [ -n "$st" ] && [ "$st" != "T" ]; then kill -STOP $p 2>/dev/null && echo $p >> $stopped; fi
    done
    sleep 1
  done
}
watch & W=$!
cleanup() {   # stop the watcher first, then resume everything it paused
  kill $W 2>/dev/null; wait $W 2>/dev/null
  for p in $(sort -u $stopped); do kill -CONT $p 2>/dev/null; done
  rm -f $stopped
}
trap cleanup EXIT
sleep ${IDLE_SETTLE:-8}
echo "== start $(date +%T) load $(cat /proc/loadavg)" >> $LOG
ps -eo stat,pcpu,args --sort=-pcpu | awk '$1 !~ /T/' | head -4 >> $LOG
"$@"
rc=$?
echo "== end $(date +%T) load $(cat /proc/loadavg) rc $rc" >> $LOG
ps -eo stat,pcpu,args --sort=-pcpu | awk '$1 !~ /T/' | head -4 >> $LOG
exit $rc
