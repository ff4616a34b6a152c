#!/usr/bin/env bash
# Every command printed in README.md and docs/USER_GUIDE.md runs as printed from the repo root:
# each `build/bin/qrun ...` line of a code block is executed (a run, an eval or a `data inspect`
# as `validate` with the same recipe and --set overrides, so no training starts, also under
# `--nproc-per-node N`; `check`,
# `plugins`, `validate` and `--version` as printed; a GPU-only `check` may refuse on CPU with its
# CUDA-only message), and `.venv/bin/hf download` must exist. Synopsis lines (with <...> or
# [...]) are skipped. Usage: check_doc_commands.sh QRUN_BIN SOURCE_DIR
set -uo pipefail
qrun=$1 src=$2
cd "$src"
fail=0 n=0
log=$(mktemp); trap 'rm -f "$log"' EXIT
run() {  # run CMD... ; echo result
  "$@" > "$log" 2>&1
}
while IFS= read -r entry; do
  file=${entry%%:*}; rest=${entry#*:}; line=${rest%%:*}; cmd=${rest#*:}
  cmd=$(sed -E 's/^ +//; s/ +#.*$//; s/ +$//' <<< "$cmd")
  [[ "$cmd" == *"<"* || "$cmd" == *"["* ]] && continue
  read -r -a argv <<< "$cmd"
  n=$((n + 1))
  where="$file:$line: $cmd"
  case "${argv[0]}" in
    .venv/bin/hf)
      run .venv/bin/hf "${argv[1]}" --help || { echo "FAIL $where (no such hf command)"; cat "$log"; fail=1; }
      continue ;;
  esac
  args=("${argv[@]:1}")
  # `qrun --nproc-per-node N <recipe> ...`: the recipe and overrides must validate (no ranks start).
  [[ "${args[0]:-}" == --nproc-per-node ]] && args=("${args[@]:2}")
  sub=${args[0]:-}
  case "$sub" in
    *.yaml) run "$qrun" validate $(printf '%s\n' "${args[@]}" | grep -vx -- '--resume') ;;
    eval) run "$qrun" validate "${args[@]:1}" ;;
    data) # data inspect R [-n N] [--set ...]: the recipe and overrides must validate
      vargs=(); skip=0
      for a in "${args[@]:2}"; do
        if ((skip)); then skip=0; continue; fi
        if [[ "$a" == -n ]]; then skip=1; continue; fi
        vargs+=("$a")
      done
      run "$qrun" validate "${vargs[@]}" ;;
    check)
      run "$qrun" "${args[@]}"
      rc=$?
      if [[ $rc == 2 ]] && grep -q "runs on CUDA only" "$log"; then
        echo "ok   $where (CUDA only: refused on this machine, as documented)"; continue
      fi
      (exit $rc) ;;
    *) run "$qrun" "${args[@]}" ;;
  esac
  rc=$?
  if [[ $rc == 0 ]]; then echo "ok   $where"; else
    echo "FAIL $where (exit status $rc)"; tail -n 20 "$log"; fail=1
  fi
done < <(grep -nE '^ {4,}(build/bin/qrun|\.venv/bin/hf) ' README.md docs/USER_GUIDE.md)
echo "$n documented commands checked"
[[ $n -gt 0 ]] || { echo "no documented commands found"; exit 1; }
exit $fail
