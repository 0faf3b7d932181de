#!/usr/bin/env python3
"""A connect burst: N clients connect at once, each sends `version\\r\\n` and waits for its
`VERSION` reply; the burst's time is from the first connect to the last reply. kvlab under
each I/O model vs memcached, A B A B, with the ratio per pair.

    scripts/connect-burst.py [--conns 5000] [--kvlab target/release/kvlab]
                             [--io reactor,epoll,signal,threaded] [--rounds 2] [-t 4]

Both servers listen on 127.0.0.1 with `-c` above N and their default listen backlog
(memcached 1024; kvlab `-b`, default 1024) unless `--backlog` is given. Also reports how
many connections took 0.9 s or more (a SYN or its ACK dropped by a full accept queue and
retried after the kernel's 1 s timeout)."""
import argparse, errno, os, json, resource, selectors, socket, subprocess, sys, time
from procutil import free_port


def wait_ready(port):
    for _ in range(200):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=2)
            s.sendall(b"version\r\n")
            if s.recv(64).startswith(b"VERSION"):
                s.close(); return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError("server did not start")


def burst(port, n, deadline_s=60.0):
    sel = selectors.DefaultSelector()
    t0 = time.monotonic()
    started = {}
    for i in range(n):
        s = socket.socket(); s.setblocking(False)
        e = s.connect_ex(("127.0.0.1", port))
        if e not in (0, errno.EINPROGRESS):
            raise RuntimeError(f"connect: {errno.errorcode.get(e, e)}")
        started[s] = t0
        sel.register(s, selectors.EVENT_WRITE, [b"", False])
    done, slow, failed = 0, 0, 0
    while done + failed < n:
        if time.monotonic() - t0 > deadline_s:
            raise RuntimeError(f"burst not done after {deadline_s} s: {done} of {n}")
        for key, ev in sel.select(timeout=1.0):
            s, st = key.fileobj, key.data
            if not st[1]:
                if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    sel.unregister(s); s.close(); failed += 1; continue
                s.send(b"version\r\n"); st[1] = True
                sel.modify(s, selectors.EVENT_READ, st); continue
            try:
                b = s.recv(256)
            except OSError:
                b = b""
            if not b:
                sel.unregister(s); s.close(); failed += 1; continue
            st[0] += b
            if st[0].endswith(b"\r\n"):
                if not st[0].startswith(b"VERSION"):
                    failed += 1
                else:
                    done += 1
                    if time.monotonic() - t0 >= 0.9:
                        slow += 1
                sel.unregister(s); s.close()
    return {"seconds": round(time.monotonic() - t0, 3), "ok": done, "failed": failed,
            "waited_0_9s": slow}


def run(cmd, port, n):
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port)
        return burst(port, n)
    finally:
        p.terminate(); p.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--conns", type=int, default=5000)
    ap.add_argument("--kvlab", default="target/release/kvlab")
    ap.add_argument("--io", default="reactor,epoll,signal,threaded")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("-t", "--threads", type=int, default=4)
    ap.add_argument("--backlog", type=int, default=None)
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, a.conns + 1000)), hard))
    c = str(a.conns + 100)
    b = [] if a.backlog is None else ["-b", str(a.backlog)]
    for io in a.io.split(","):
        for r in range(a.rounds):
            pk, pm = free_port(), free_port()
            kv = run([a.kvlab, "server", "-p", str(pk), "-t", str(a.threads), "-c", c,
                      "--io", io] + b, pk, a.conns)
            root = ["-u", "root"] if os.geteuid() == 0 else []
            mc = run(["memcached", "-U", "0", "-l", "127.0.0.1", "-p", str(pm), "-t", str(a.threads),
                      "-c", c] + root + b, pm, a.conns)
            print(json.dumps({"io": io, "round": r + 1, "kvlab": kv, "memcached": mc,
                              "ratio": round(kv["seconds"] / mc["seconds"], 2)}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
