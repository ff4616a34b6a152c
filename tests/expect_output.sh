#!/usr/bin/env bash
# Runs a command and passes only when its exit status AND its output match one of the stated
# outcomes (ctest's PASS_REGULAR_EXPRESSION alone ignores the exit status).
#   expect_output.sh RC REGEX [RC REGEX ...] -- COMMAND [ARGS...]
# The output (stdout and stderr) is echoed in full, so ctest's log keeps it.
set -u
outcomes=()
while [[ $# -gt 0 && "$1" != "--" ]]; do
  [[ $# -ge 2 ]] || { echo "expect_output.sh: RC REGEX pairs, then --, then the command" >&2; exit 2; }
  outcomes+=("$1" "$2"); shift 2
done
[[ "${1:-}" == "--" && $# -ge 2 && ${#outcomes[@]} -ge 2 ]] || {
  echo "usage: expect_output.sh RC REGEX [RC REGEX ...] -- COMMAND [ARGS...]" >&2; exit 2; }
shift
log=$(mktemp); trap 'rm -f "$log"' EXIT
"$@" > "$log" 2>&1
rc=$?
cat "$log"
for ((i = 0; i < ${#outcomes[@]}; i += 2)); do
  if [[ "$rc" == "${outcomes[i]}" ]] && grep -Eqz -- "${outcomes[i+1]}" "$log"; then exit 0; fi
done
echo "expect_output.sh: exit status $rc with output not matching any expected outcome:" >&2
for ((i = 0; i < ${#outcomes[@]}; i += 2)); do
  echo "  status ${outcomes[i]} and /${outcomes[i+1]}/" >&2
done
exit 1
