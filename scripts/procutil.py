"""What the measurement scripts share: a free local port, a process's resident memory."""
import socket


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p


def rss_kb(pid):
    """The resident set of process `pid`, kB (VmRSS of /proc/<pid>/status)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")
