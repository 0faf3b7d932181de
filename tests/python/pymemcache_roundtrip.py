"""Round-trips every common command through pymemcache (a real client from PyPI).

Usage: python3 pymemcache_roundtrip.py PORT [--proxy] [--tls CA_FILE]
Exits non-zero with a message on the first mismatch. With --tls, over TLS, trusting CA_FILE.
"""
import ssl
import sys

from pymemcache.client.base import Client
from pymemcache.exceptions import MemcacheServerError


def main(port: int, proxy: bool = False, ca_file: str = "") -> None:
    tls = ssl.create_default_context(cafile=ca_file) if ca_file else None
    c = Client(("127.0.0.1", port), connect_timeout=5, timeout=5, default_noreply=False,
               tls_context=tls)
    assert c.flush_all() is True
    assert c.set("k", b"v1", expire=0, noreply=False) is True
    assert c.get("k") == b"v1"
    assert c.get("missing") is None
    assert c.add("k", b"x", noreply=False) is False
    assert c.add("k2", b"x", noreply=False) is True
    assert c.replace("k2", b"y", noreply=False) is True
    assert c.replace("nope", b"y", noreply=False) is False
    assert c.append("k2", b"z", noreply=False) is True
    assert c.prepend("k2", b"a", noreply=False) is True
    assert c.get("k2") == b"ayz"
    value, cas = c.gets("k2")
    assert value == b"ayz" and int(cas) > 0
    assert c.cas("k2", b"new", cas, noreply=False) is True
    assert c.cas("k2", b"newer", cas, noreply=False) is False
    assert c.cas("never", b"x", 1, noreply=False) is None
    assert c.get("k2") == b"new"
    assert c.set("n", b"10", noreply=False) is True
    assert c.incr("n", 5, noreply=False) == 15
    assert c.decr("n", 20, noreply=False) == 0
    assert c.incr("missing", 1, noreply=False) is None
    assert c.touch("n", 100, noreply=False) is True
    assert c.touch("missing", 100, noreply=False) is False
    assert c.delete("n", noreply=False) is True
    assert c.delete("n", noreply=False) is False
    many = {f"key{i}": f"value{i}".encode() for i in range(200)}
    assert c.set_many(many, noreply=False) == []
    got = c.get_many(list(many) + ["absent"])
    assert got == many, "get_many mismatch"
    assert c.gets_many(["key1", "key2"])["key1"][0] == b"value1"
    big = bytes(range(256)) * 4000  # ~1 MB minus a little, binary
    assert c.set("big", big, noreply=False) is True
    assert c.get("big") == big
    try:
        c.set("toolarge", b"x" * (1024 * 1024 + 1), noreply=False)
        raise AssertionError("an over-limit value was accepted")
    except MemcacheServerError as e:
        assert "object too large" in str(e), e
    assert c.get("toolarge") is None
    # noreply writes are visible to the next read on the same connection.
    c.set("quiet", b"q", noreply=True)
    assert c.get("quiet") == b"q"
    stats = c.stats()
    fields = [b"pid", b"uptime", b"curr_connections", b"cmd_get", b"get_hits", b"threads"]
    # A proxy holds no items itself; it counts its requests instead.
    fields += [b"proxy_requests"] if proxy else [b"curr_items", b"bytes", b"limit_maxbytes"]
    for field in fields:
        assert field in stats, f"stats lacks {field!r}"
    assert int(stats[b"get_hits"]) > 0
    assert c.stats("settings")[b"item_size_max"] == 1048576
    assert c.version()
    assert c.flush_all() is True
    assert c.get("k") is None
    c.quit()
    print("pymemcache: all round trips passed")


if __name__ == "__main__":
    args = sys.argv[2:]
    ca = args[args.index("--tls") + 1] if "--tls" in args else ""
    main(int(sys.argv[1]), proxy="--proxy" in args, ca_file=ca)
