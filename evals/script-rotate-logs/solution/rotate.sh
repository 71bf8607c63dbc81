#!/bin/bash
if [ $# -ne 2 ] || [ ! -d "$1" ]; then echo "usage: rotate.sh DIR KEEP" >&2; exit 2; fi
dir=$1 keep=$2
for f in "$dir"/*.log; do
  [ -e "$f" ] || continue
  for ((i = keep; i >= 1; i--)); do [ -e "$f.$i" ] && mv "$f.$i" "$f.$((i + 1))"; done
  mv "$f" "$f.1"; : > "$f"
  for old in "$f".*; do n=${old##*.}; [[ $n =~ ^[0-9]+$ ]] && [ "$n" -gt "$keep" ] && rm -f "$old"; done
done
exit 0
