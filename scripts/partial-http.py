#!/usr/bin/env python3
"""Partial HTTP requests against kvlab server's REST port: N clients each send the start of
a request (`GET / HTTP/1.1\\r\\nHost: x\\r\\n`, never finished) to a server started with an
open-file limit of LIMIT. Prints the server's descriptors and RSS once every client has
connected, whether the memcached port still answers `version` meanwhile, and the
descriptors once the REST port's idle timeout (30 s) has passed.

    scripts/partial-http.py [--clients 2100] [--limit 2048] [--kvlab target/release/kvlab]

The server: `kvlab server -l 127.0.0.1 -p P --http-port H -t 4`, its RLIMIT_NOFILE set to
LIMIT before it starts (kvlab raises its soft limit up to the hard one it is given)."""
import argparse, os, resource, socket, subprocess, time
from procutil import free_port, rss_kb


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def answers_version(port):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=3)
        s.sendall(b"version\r\n")
        ok = s.recv(100).startswith(b"VERSION")
        s.close()
        return ok
    except OSError:
        return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=2100)
    ap.add_argument("--limit", type=int, default=2048)
    ap.add_argument("--kvlab", default="target/release/kvlab")
    a = ap.parse_args()
    # This script holds every client's socket: its own limit must allow them.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, a.clients + 100), max(hard, a.clients + 100)))
    port, http = free_port(), free_port()
    limit = a.limit

    def limited():
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    server = subprocess.Popen(
        [a.kvlab, "server", "-l", "127.0.0.1", "-p", str(port), "--http-port", str(http), "-t", "4"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=limited)
    try:
        for _ in range(200):
            if answers_version(port):
                break
            time.sleep(0.05)
        before = (fds(server.pid), rss_kb(server.pid))
        clients, refused = [], 0
        for _ in range(a.clients):
            try:
                # Past the backlog the kernel drops the SYN: do not wait for its retries.
                s = socket.create_connection(("127.0.0.1", http), timeout=0.1)
                s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
                clients.append(s)
            except OSError:
                refused += 1
        time.sleep(1)
        during = (fds(server.pid), rss_kb(server.pid))
        memcached_port = answers_version(port)
        time.sleep(32)
        after = fds(server.pid)
        closed = 0
        for s in clients:
            s.setblocking(False)
            try:
                if s.recv(1) == b"":
                    closed += 1
            except BlockingIOError:
                pass
            except OSError:
                closed += 1
        print(f"clients {a.clients} ({refused} not connected within 0.1 s: past the listen "
              f"backlog), server open-file limit {limit}")
        print(f"server descriptors: before {before[0]}, with every client connected {during[0]}, "
              f"32 s later {after}")
        print(f"server RSS: before {before[1]} kB, with every client connected {during[1]} kB")
        print(f"memcached port answers version while they are open: {'yes' if memcached_port else 'NO'}")
        print(f"clients whose connection the server closed after the idle timeout: {closed}")
        for s in clients:
            s.close()
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
