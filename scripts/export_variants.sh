#!/usr/bin/env bash
# Write each named branch's change against main (from their merge base) as .device/variants/<branch>.patch,
# for `scripts/gpu_session.sh variants` to time on the GPU box against main (see DEVELOPERS.md). With no
# branch named: every local branch whose name starts with pending-. Old patches in the folder are removed.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=.device/variants
branches=("$@")
if [ ${#branches[@]} -eq 0 ]; then
  mapfile -t branches < <(git for-each-ref --format='%(refname:short)' 'refs/heads/pending-*')
fi
[ ${#branches[@]} -gt 0 ] || { echo "export_variants: no branch named and no pending-* branch" >&2; exit 1; }
mkdir -p "$dir"
rm -f "$dir"/*.patch
for b in "${branches[@]}"; do
  git rev-parse --verify -q "$b" > /dev/null || { echo "export_variants: no branch $b" >&2; exit 1; }
  git diff "main...$b" > "$dir/$b.patch"
  [ -s "$dir/$b.patch" ] || { echo "export_variants: $b does not differ from main" >&2; exit 1; }
  git apply --check "$dir/$b.patch" || { echo "export_variants: $b's change does not apply to this tree" >&2; exit 1; }
  echo "$dir/$b.patch: $(git diff --shortstat "main...$b")"
done
