#!/usr/bin/env bash
# Kernel changes to time on the GPU box against main, as patches in .device/variants/ for
# `scripts/gpu_session.sh variants` (see DEVELOPERS.md). Each argument is
#   BRANCH   its change against main (from their merge base): .device/variants/BRANCH.patch
#   A..B     commits A..B already on main taken back out of src/ and tests/ (the diff from B to A there, so
#            that docs and scripts stay, and the tests build against the code they were written for):
#            revert-A-B.patch, which times main against the code before those commits. Each patch applies to
#            main alone, so a range is separable only where no later commit on main touches its lines
# With no argument: every local branch whose name starts with pending-. Old patches in the folder are removed.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=.device/variants
args=("$@")
if [ ${#args[@]} -eq 0 ]; then
  mapfile -t args < <(git for-each-ref --format='%(refname:short)' 'refs/heads/pending-*')
fi
[ ${#args[@]} -gt 0 ] || { echo "export_variants: nothing named and no pending-* branch" >&2; exit 1; }
mkdir -p "$dir"
rm -f "$dir"/*.patch
for a in "${args[@]}"; do
  if [[ $a == *..* ]]; then
    from=${a%%..*} to=${a##*..}
    for r in "$from" "$to"; do
      git rev-parse --verify -q "$r^{commit}" > /dev/null || { echo "export_variants: no commit $r" >&2; exit 1; }
    done
    git merge-base --is-ancestor "$to" main || { echo "export_variants: $to is not on main" >&2; exit 1; }
    name="revert-$(git rev-parse --short "$from")-$(git rev-parse --short "$to")"
    git diff "$to" "$from" -- src tests > "$dir/$name.patch"
    what=$(git diff --shortstat "$to" "$from" -- src tests)
  else
    git rev-parse --verify -q "$a" > /dev/null || { echo "export_variants: no branch $a" >&2; exit 1; }
    name=$a
    git diff "main...$a" > "$dir/$name.patch"
    what=$(git diff --shortstat "main...$a")
  fi
  [ -s "$dir/$name.patch" ] || { echo "export_variants: $a changes nothing" >&2; exit 1; }
  git apply --check "$dir/$name.patch" ||
    { echo "export_variants: $a's patch does not apply to this tree" >&2; exit 1; }
  echo "$dir/$name.patch: $what"
done
