#!/usr/bin/env python3
"""RSS after pipelined floods (issue 25, item 10): CLIENTS connections each pipeline SETS
sets of SIZE bytes (distinct keys) and close without reading a reply; after each flood,
once the server counts no client connection, print its RSS. kvlab per I/O model vs
memcached, same -m.

    scripts/flood-rss.py [--kvlab target/release/kvlab] [--clients 200] [--sets 1000]
                         [--size 10240] [--floods 4] [--m 64] [--models reactor,threaded,epoll,signal]

Prints one line per server: the RSS in MB after each flood, and the stored bytes."""
import argparse, socket, subprocess, threading, time
from procutil import free_port, rss_kb

def ask(port, req, until):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(req); out = b""
    while not out.endswith(until):
        b = s.recv(65536)
        if not b: break
        out += b
    s.close(); return out.decode()

def stats(port):
    out = {}
    for line in ask(port, b"stats\r\n", b"END\r\n").splitlines():
        p = line.split()
        if len(p) == 3 and p[0] == "STAT":
            out[p[1]] = p[2]
    return out

def wait_ready(port):
    for _ in range(400):
        try:
            ask(port, b"version\r\n", b"\r\n"); return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("server did not start")

def flood(port, clients, sets, size, round_):
    value = b"v" * size
    def client(c):
        req = b"".join(b"set f%d:%d:%d 0 0 %d\r\n%s\r\n" % (round_, c, i, size, value)
                       for i in range(sets))
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=60)
            s.sendall(req); s.close()
        except OSError:
            pass
    ts = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in ts: t.start()
    for t in ts: t.join()

def settle(port):
    # Our own stats connection is the only one left once the server has read every flood
    # connection to its end and closed it.
    for _ in range(600):
        if int(stats(port)["curr_connections"]) <= 2:
            return
        time.sleep(0.1)

def measure(name, cmd, port, a):
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port)
        out = []
        for r in range(a.floods):
            flood(port, a.clients, a.sets, a.size, r)
            settle(port)
            time.sleep(1)
            out.append(rss_kb(p.pid) / 1024)
        st = stats(port)
        print(f"{name:10} RSS MB after each flood: " + " ".join(f"{x:.0f}" for x in out)
              + f"   stored {int(st['bytes']) / 2**20:.0f} MiB", flush=True)
    finally:
        p.terminate(); p.wait()

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvlab", default="target/release/kvlab")
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--sets", type=int, default=1000)
    ap.add_argument("--size", type=int, default=10240)
    ap.add_argument("--floods", type=int, default=4)
    ap.add_argument("--m", default="64")
    ap.add_argument("--models", default="reactor,threaded,epoll,signal")
    ap.add_argument("--no-memcached", action="store_true")
    a = ap.parse_args()
    for io in a.models.split(","):
        port = free_port()
        measure(f"kvlab {io}", [a.kvlab, "server", "-p", str(port), "-l", "127.0.0.1",
                                "-m", a.m, "-c", "4096", "--io", io], port, a)
    if not a.no_memcached:
        port = free_port()
        measure("memcached", ["memcached", "-p", str(port), "-l", "127.0.0.1", "-U", "0",
                              "-m", a.m, "-c", "4096", "-u", "root"], port, a)

main()
