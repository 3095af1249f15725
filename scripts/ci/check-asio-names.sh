#!/usr/bin/env bash
# The Asio-names guard (.ci/run runs it first; it takes a second, builds nothing). Fails when C++
# or CUDA code outside callbacks/include/evr/callbacks/asio_compat.hpp
#   * names in asio::experimental (boost::asio::experimental, any prefix) a name listed in
#     callbacks/include/evr/callbacks/asio_compat_names.txt, or a name that starts with one
#     (as_tuple_t), or includes its header <asio/experimental/NAME.hpp>: these are experimental in
#     one supported Asio and not in another, or spelled once in asio_compat.hpp (evr::compat::NAME);
#   * or hides such names from this check: `using namespace ...experimental;` or a namespace alias
#     of an experimental namespace (spell asio::experimental::concurrent_channel etc. in full).
# Comments count too: code is checked as written, not as compiled.
#
#   scripts/ci/check-asio-names.sh            # the repository: the files git tracks or would track
#   scripts/ci/check-asio-names.sh PATH...    # these files and folders instead
#
# Prints each offending line with the name's entry from the list; exits 1 if there is one, 2 when
# the list cannot be read.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
compat="callbacks/include/evr/callbacks/asio_compat.hpp"
list="$root/callbacks/include/evr/callbacks/asio_compat_names.txt"

if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then
  sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi

# The list: "name  version  where it is", '#' comments.
names=()
notes=()
while read -r name version note; do
  [[ -z "$name" || "$name" == \#* ]] && continue
  if [[ ! "$name" =~ ^[A-Za-z_][A-Za-z0-9_]*$ || -z "$version" ]]; then
    echo "check-asio-names: $list: bad line: $name $version $note" >&2
    exit 2
  fi
  names+=("$name")
  if [[ "$version" == - ]]; then
    notes+=("$note")
  else
    notes+=("moved in Asio $version: $note")
  fi
done < <(cat "$list")
if [[ ${#names[@]} -eq 0 ]]; then
  echo "check-asio-names: no names in $list" >&2
  exit 2
fi

# The files: C/C++/CUDA sources and headers.
is_source() { [[ "$1" =~ \.(h|hh|hpp|hxx|ipp|inl|c|cc|cpp|cxx|cu|cuh)$ ]]; }
files=()
if [[ $# -gt 0 ]]; then
  while IFS= read -r -d '' f; do
    is_source "$f" && files+=("$f")
  done < <(find "$@" -type f -print0)
else
  cd "$root"
  if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    listing=(git ls-files -z --cached --others --exclude-standard)
  else  # an unpacked archive: everything but build output and staged dependencies
    listing=(find . \( -path ./build -o -path ./.deps -o -path ./.git \) -prune -o -type f -print0)
  fi
  while IFS= read -r -d '' f; do
    f="${f#./}"
    [[ -f "$f" ]] && is_source "$f" && files+=("$f")  # git lists deleted, uncommitted files too
  done < <("${listing[@]}")
fi
compat_real="$(realpath "$root/$compat")"
checked=()
for f in "${files[@]}"; do
  [[ "$(realpath "$f")" == "$compat_real" ]] || checked+=("$f")
done
if [[ ${#checked[@]} -eq 0 ]]; then
  echo "check-asio-names: no C++ files to check" >&2
  exit 2
fi

# experimental::NAME (spaces allowed around ::) or experimental/NAME (the header).
found=0
report() {  # report WHAT HINT < grep -nH output
  local hit
  while IFS= read -r hit; do
    echo "$hit" | sed 's/[[:space:]]\{2,\}/ /g'
    echo "    -> $1: $2"
    found=1
  done
}
for i in "${!names[@]}"; do
  name="${names[$i]}"
  re="experimental([[:space:]]*::[[:space:]]*|/)${name}"
  report "asio::experimental::$name (${notes[$i]})" \
    "use evr::compat::$name from <evr/callbacks/asio_compat.hpp> (add it there if it is missing)" \
    < <(grep -nHE -- "$re" "${checked[@]}" || true)
done
ident='[[:alnum:]_:[:space:]]*'
hide_re="using[[:space:]]+namespace[[:space:]]+${ident}experimental[[:space:]]*;|namespace[[:space:]]+[[:alnum:]_]+[[:space:]]*=[[:space:]]*${ident}experimental[[:space:]]*;"
report "a using-directive or alias of an experimental namespace" \
  "it hides the names of ${list#"$root"/} from this check: spell asio::experimental::NAME in full" \
  < <(grep -nHE -- "$hide_re" "${checked[@]}" || true)

if [[ "$found" == 1 ]]; then
  echo "check-asio-names: FAILED: Asio names that differ between versions must go through $compat" >&2
  exit 1
fi
echo "check-asio-names: OK: ${#checked[@]} files, ${#names[@]} names (${list#"$root"/}), none named outside $compat"
