#!/usr/bin/env bash
# The device tool carries at most 64 MiB of working tree and bundle; the fixture models alone
# are 75 MB. `hide` untracks the two largest model folders (kept on disk) and ignores them for
# the call; `restore` puts them back. Run restore even when the call failed.
set -euo pipefail
cd "$(dirname "$0")/.."
LARGE=(tests/fixtures/models/demo-code-target tests/fixtures/models/tiny-deepseek-v3-chat)
case "${1:-}" in
  hide)
    git rm -r -q --cached "${LARGE[@]}"
    {
      echo "# device-tree.sh begin"
      for dir in "${LARGE[@]}"; do echo "/$dir/"; done
      echo "# device-tree.sh end"
    } >>.git/info/exclude
    ;;
  restore)
    sed -i '/^# device-tree.sh begin$/,/^# device-tree.sh end$/d' .git/info/exclude
    git reset -q HEAD -- "${LARGE[@]}"
    git status --short -- tests/fixtures | head -5
    ;;
  *) echo "usage: $0 hide|restore" >&2; exit 2 ;;
esac
