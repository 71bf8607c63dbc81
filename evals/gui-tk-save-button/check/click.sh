# Clicks the Save button of a freshly started clicker.py and waits for the file it writes.
set -u
export DISPLAY=${DISPLAY:-:0}  # the guest's desktop; a test gives its own
[ -f clicked.txt ] && mv clicked.txt "$CHECK_DIR/clicked.before"
restore() { rm -f clicked.txt; [ -f "$CHECK_DIR/clicked.before" ] && mv "$CHECK_DIR/clicked.before" clicked.txt; }
# This run's own window: one the agent left open may have been started elsewhere.
old=" $(xdotool search --onlyvisible --name '^Clicker$' 2>/dev/null | tr '\n' ' ') "
python3 clicker.py & app=$!
wid=""
for i in $(seq 60); do
  for w in $(xdotool search --onlyvisible --name '^Clicker$' 2>/dev/null); do
    case "$old" in *" $w "*) ;; *) wid=$w ;; esac
  done
  [ -n "$wid" ] && break
  sleep 0.5
done
if [ -z "$wid" ]; then echo "no visible window named Clicker"; kill $app; restore; exit 1; fi
eval "$(xdotool getwindowgeometry --shell "$wid")"
xdotool windowactivate --sync "$wid" 2>/dev/null
xdotool mousemove --window "$wid" $((WIDTH / 2)) $((HEIGHT / 2)) click 1
for i in $(seq 20); do grep -qx clicked clicked.txt 2>/dev/null && break; sleep 0.5; done
grep -qx clicked clicked.txt 2>/dev/null && ok=0 || ok=1
kill $app 2>/dev/null
[ $ok -eq 0 ] && echo "the click wrote clicked.txt" || echo "clicked.txt not written by the click"
rm -f clicked.txt; [ -f "$CHECK_DIR/clicked.before" ] && mv "$CHECK_DIR/clicked.before" clicked.txt
exit $ok
