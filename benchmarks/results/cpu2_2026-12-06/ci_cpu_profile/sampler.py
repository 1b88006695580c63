"""Every 0.5 s: the CPU seconds of every process (utime+stime, children not counted) with its command line and
parent; writes the last-seen values per pid to a JSON file at the end (SIGTERM) and every 30 s."""
import json, os, signal, sys, time
TICK = os.sysconf("SC_CLK_TCK")
seen = {}
out = sys.argv[1]
def dump(*_):
    json.dump(seen, open(out + ".tmp", "w")); os.replace(out + ".tmp", out)
    if _: sys.exit(0)
signal.signal(signal.SIGTERM, dump)
last = time.time()
while True:
    for pid in os.listdir("/proc"):
        if not pid.isdigit(): continue
        try:
            stat = open(f"/proc/{pid}/stat").read()
            rest = stat[stat.rindex(")") + 2:].split()
            ppid, utime, stime, start = int(rest[1]), int(rest[11]), int(rest[12]), int(rest[19])
            key = f"{pid}:{start}"
            if key not in seen:
                cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")[:300]
                seen[key] = {"cmd": cmd, "ppid": ppid, "first": time.time()}
            seen[key]["cpu"] = (utime + stime) / TICK
            seen[key]["last"] = time.time()
        except (OSError, ValueError, IndexError):
            pass
    if time.time() - last > 30:
        dump(); last = time.time()
    time.sleep(0.5)
