#!/usr/bin/env python3
"""RSS per idle connection: N connections to a server, kvlab vs memcached. Prints kB per
connection for each server. `--state` says what each connection did before it went idle:
`partial` holds half a command (`get k`, no newline: the server must keep it), `answered`
sent a whole request and read its reply (a client between requests: the common idle
connection of a pool), `none` never sent a byte.

    scripts/idle-conn-rss.py [--conns 10000] [--kvlab target/release/kvlab] [--rounds 2] [--io threaded] [--state partial|answered|none]

Servers listen on 127.0.0.1 with -c above N; the RSS is read from /proc/<pid>/status
before the connections and once all are open and `stats` counts them."""
import argparse, os, resource, socket, subprocess, sys, time
from procutil import free_port, rss_kb

def ask(port, req, until):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(req); out = b""
    while not out.endswith(until):
        b = s.recv(65536)
        if not b: break
        out += b
    s.close(); return out.decode()

def stat(port, name):
    for line in ask(port, b"stats\r\n", b"END\r\n").splitlines():
        if line.startswith(f"STAT {name} "):
            return int(line.split()[2])

def wait_ready(port):
    for _ in range(200):
        try:
            ask(port, b"version\r\n", b"\r\n"); return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("server did not start")

SETTLE = 2.5

def measure(cmd, port, n, state):
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port)
        # Warm: one connection's worth of per-thread state exists before the baseline.
        ask(port, b"set k 0 0 1\r\nx\r\nget k\r\n", b"END\r\n")
        time.sleep(0.5)
        before = rss_kb(p.pid)
        conns = []
        for i in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            if state == "partial":
                s.sendall(b"get k")
            elif state == "answered":
                s.sendall(b"get k\r\n")
                got = b""
                while not got.endswith(b"END\r\n"):
                    got += s.recv(4096)
            conns.append(s)
        for _ in range(600):
            if stat(port, "curr_connections") >= n:
                break
            time.sleep(0.05)
        time.sleep(SETTLE)
        after = rss_kb(p.pid)
        for s in conns:
            s.close()
        return (after - before) / n, before, after
    finally:
        p.terminate(); p.wait(10)

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--conns", type=int, default=10000)
    ap.add_argument("--kvlab", default="target/release/kvlab")
    ap.add_argument("--memcached", default="/usr/bin/memcached")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--io", default="reactor", help="kvlab's I/O model")
    ap.add_argument("--state", default="partial", choices=["partial", "answered", "none"])
    ap.add_argument("--settle", type=float, default=2.5,
                    help="seconds idle before the RSS is read (kvlab gives an idle connection's buffers back within 2 s)")
    a = ap.parse_args()
    global SETTLE
    SETTLE = a.settle
    want = a.conns * 2 + 1000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(soft, want), hard), hard))
    c = str(a.conns + 100)
    for r in range(a.rounds):  # A B A B
        for name in ("kvlab", "memcached"):
            port = free_port()
            if name == "kvlab":
                cmd = [a.kvlab, "server", "-p", str(port), "-t", "4", "-c", c, "--io", a.io]
            else:
                cmd = [a.memcached, "-u", "root", "-U", "0", "-l", "127.0.0.1", "-p", str(port), "-t", "4", "-c", c]
            per, before, after = measure(cmd, port, a.conns, a.state)
            print(f"round {r+1} {name:9s} {a.conns} idle connections ({a.state}): RSS {before} kB -> {after} kB, {per:.2f} kB per connection", flush=True)

if __name__ == "__main__":
    sys.exit(main())
