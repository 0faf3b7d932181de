r"""Randomized differential test through pymemcache: one seeded stream of client calls is
made on two servers in lock step (kvlab and memcached 1.6), and each call's outcome — its
return value, or the exception it raised (type and message) — must be the same.

Usage: python3 pymemcache_differential.py KVLAB_PORT MEMCACHED_PORT [--ops N] [--seed S]...
       [--log]
Prints one line per seed; on a difference, the seed, the call's index, the call and both
outcomes (at most 10 per seed), and exits 1. `--log` prints every call with memcached's
outcome. Run by `crates/server/tests/pymemcache_differential.rs`. The stream is Python's
`random.Random(seed)`: the same calls on every machine.

The calls are pymemcache `Client` methods: `set add replace append prepend cas set_many get
get_many gets gets_many delete delete_many incr decr touch flush_all quit`, each that can
with and without `noreply`. Values are bytes: binary (NUL, `\r`, `\n`, bytes >= 0x80),
counters (digits, some space-padded), blank (empty or whitespace only), and now and then
1-300 KB or over the 1 MB item limit. Flags span 32 bits and now and then go past them:
2^32 + n (the server keeps the low 32 bits) and -1 (refused, and the data block is then
read as commands; -1 goes only with values of at most 1,000 bytes, since a longer block is
one line over memcached's 2,048 bytes, which closes the connection while the client may
still be writing it, so whether that call or the next sees the reset is a matter of
timing). Keys are few, so that hits, misses and conflicts all happen; one is 250 bytes
long. Exptimes are 0, relative (3600: nothing expires while the test runs, whatever either
server's clock says) or negative (expired at once); `flush_all` has no delay: no outcome
depends on a clock. Deltas are small, large, negative or >= 2^64 (the last two refused).

pymemcache does not read the reply of a `noreply` call: a server that answers one anyway
shows as a wrong outcome of a later call. It closes the connection on any exception and
opens a new one on the next call, on each server alike.

Values come back with their flags (a serde that returns `(value, flags)`). CAS tokens
differ between the servers (each numbers its own): a `gets` outcome shows `<cas>` instead,
the pair (kvlab's, memcached's) is remembered per key for later `cas` calls (the latest,
an older, stale one, or a made-up token), and the pairs must stay one-to-one: kvlab's token
X is always seen where memcached's is Y.

Not drawn, because memcached 1.6's answer depends on leftover memory there, not on the
commands: counters of 2^63 or more (values stay below 2^62, deltas below 2^40; as in the
raw-socket `differential.rs`, its `strtoull` then looks for a `-` past the item's end), and
`incr`/`decr` of a blank value: blank values go only under `BLANK_KEYS`, which `incr` and
`decr` never name. memcached's `strtoull` skips the blank and the item's `\r\n` and reads
on: 1.6.18 has answered `set d 0 0 1`, ` `, `incr d 1` with 4611686018427387904, the digits
an earlier item left behind plus one, where kvlab answers `CLIENT_ERROR cannot increment
or decrement non-numeric value` (as memcached does when no digit follows). Nor are values
between 300 KB and the 1 MB limit: memcached's limit counts its item header, so the largest
value each accepts is an implementation detail.

Allow-list (differences that do not fail the test, each counted and printed): none.
"""

import argparse
import random
import sys

from pymemcache.client.base import Client

# Keys that may hold a blank value (empty or all whitespace) and are never counted.
BLANK_KEYS = ["b0", "b1", "b2"]
# Keys for everything else, counters included.
COUNTER_KEYS = [f"k{i}" for i in range(20)] + ["L" * 250]
KEYS = COUNTER_KEYS + BLANK_KEYS
# Bytes of binary values: CR, LF, NUL, high bytes, space, tab.
BYTES = b"ab\r\n\x00\xff\x80\xc3 xyz09\t"
# Any byte -> one of BYTES: large binary values made fast.
SPREAD = bytes(BYTES[b % len(BYTES)] for b in range(256))
NOREPLY_PERCENT = 15
MAX_DIFFS_PER_SEED = 10


class FlagsSerde:
    """Bytes in, `(bytes, flags)` out: the flags take part in every comparison."""

    def serialize(self, key, value):
        return value, 0

    def deserialize(self, key, value, flags):
        return value, flags


class Stream:
    """The seeded calls: what to call and with which arguments, for both servers alike
    (only a `cas` token differs, each server's own)."""

    def __init__(self, seed):
        self.rng = random.Random(seed)
        # key -> [(kvlab token, memcached token), ...], oldest first.
        self.cas_seen = {}

    def key(self):
        return self.rng.choice(KEYS)

    def keys(self, most):
        return [self.key() for _ in range(self.rng.randint(1, most))]

    def value(self, key):
        """A value to store under `key`: blank only for `BLANK_KEYS` (see the module doc)."""
        v = self.any_value()
        if key not in BLANK_KEYS and not v.strip():
            v += b"z"
        return v

    def any_value(self):
        r = self.rng
        kind = r.randrange(100)
        if kind < 35:
            # A counter below 2^62 (see the module doc), sometimes space-padded.
            v = str(r.getrandbits(62))[: r.randint(1, 19)].encode()
            if r.randrange(100) < 20:
                v += b" " * r.randint(1, 5)
            return v
        if kind < 38:
            return b"4611686018427387903"
        if kind < 40:
            return b""
        if kind < 41:
            return r.randbytes(r.randint(1_000, 300_000)).translate(SPREAD)
        if kind < 42:
            # Over memcached's default 1 MB item limit (`-I 1m`), value alone.
            return b"x" * (1024 * 1024 + r.randint(1, 1000))
        return bytes(r.choice(BYTES) for _ in range(r.randint(1, 40)))

    def flags(self, values):
        """Flags for a write of `values`: now and then past 32 bits, and -1 only with
        short values (see the module doc)."""
        r = self.rng
        kind = r.randrange(100)
        if kind < 75:
            return r.randrange(4)
        if kind < 98 or (kind < 99 and max(map(len, values)) > 1000):
            return r.getrandbits(32)
        return -1 if kind < 99 else 2**32 + r.randrange(4)

    def expire(self):
        kind = self.rng.randrange(100)
        return 0 if kind < 85 else 3600 if kind < 97 else -1

    def noreply(self):
        return self.rng.randrange(100) < NOREPLY_PERCENT

    def delta(self):
        r = self.rng
        kind = r.randrange(100)
        if kind < 70:
            return r.randrange(100)
        if kind < 95:
            return r.getrandbits(40)
        return r.choice([-1, 2**64, 2**64 + 5])

    def cas_tokens(self, key):
        """Each server's token for a `cas` of `key`: its latest, a stale one, or made up
        (far above any the servers hand out in a run)."""
        r = self.rng
        seen = self.cas_seen.get(key, [])
        kind = r.randrange(100)
        if seen and kind < 75:
            return seen[-1]
        if seen and kind < 90:
            return r.choice(seen)
        made_up = 1_000_000_000 + r.randrange(10)
        return made_up, made_up

    def call(self):
        """One call: (method name, positional args, kvlab's kwargs, memcached's kwargs)."""
        r = self.rng
        op = r.randrange(100)
        if op < 14:
            name = "set"
        elif op < 18:
            name = "add"
        elif op < 22:
            name = "replace"
        elif op < 26:
            name = "append"
        elif op < 30:
            name = "prepend"
        elif op < 38:
            key = self.key()
            kv_cas, mc_cas = self.cas_tokens(key)
            value = self.value(key)
            args = (key, value, None)
            kw = dict(expire=self.expire(), noreply=self.noreply(), flags=self.flags([value]))
            return "cas", args, dict(kw, cas=kv_cas), dict(kw, cas=mc_cas)
        elif op < 40:
            values = {k: self.value(k) for k in self.keys(4)}
            kw = dict(expire=self.expire(), noreply=self.noreply(),
                      flags=self.flags(values.values()))
            return "set_many", (values,), kw, kw
        elif op < 48:
            return "get", (self.key(),), {}, {}
        elif op < 56:
            return "get_many", (self.keys(5),), {}, {}
        elif op < 61:
            return "gets", (self.key(),), {}, {}
        elif op < 65:
            return "gets_many", (self.keys(4),), {}, {}
        elif op < 73:
            kw = dict(noreply=self.noreply())
            return "delete", (self.key(),), kw, kw
        elif op < 75:
            kw = dict(noreply=self.noreply())
            return "delete_many", (self.keys(3),), kw, kw
        elif op < 83:
            name = "incr" if r.randrange(2) else "decr"
            kw = dict(noreply=self.noreply())
            key = self.rng.choice(COUNTER_KEYS)
            return name, (key, self.delta()), kw, kw
        elif op < 91:
            kw = dict(expire=self.expire(), noreply=self.noreply())
            return "touch", (self.key(),), kw, kw
        elif op < 92:
            kw = dict(noreply=self.noreply())
            return "flush_all", (), kw, kw
        elif op < 93:
            return "quit", (), {}, {}
        else:
            name = "set"
        key = self.key()
        value = self.value(key)
        kw = dict(expire=self.expire(), noreply=self.noreply(), flags=self.flags([value]))
        return name, (key, value), kw, kw


def outcome(client, name, args, kwargs):
    """The call's return value, or ("raised", type, message)."""
    if name == "cas":
        key, value, _ = args
        args = (key, value, kwargs.pop("cas"))
    if name == "quit" and client.sock is not None:
        return quit_and_wait(client)
    try:
        return getattr(client, name)(*args, **kwargs)
    except Exception as e:  # every exception is an outcome to compare
        return ("raised", type(e).__name__, str(e))


def quit_and_wait(client):
    """`quit`, as pymemcache's `Client.quit` sends it, but waiting for the server to close
    the connection before the next call: the next call opens a new connection, and the
    `noreply` calls sent just before the `quit` must have been applied by then (on a busy
    machine the old connection's thread may otherwise still be behind, on either server)."""
    sock = client.sock
    try:
        sock.sendall(b"quit\r\n")
        while sock.recv(4096):
            pass
    except OSError:
        pass
    client.close()
    return None


def cas_tokens(name, result):
    """The `(key, token)` pairs of a `gets`/`gets_many` outcome, and the outcome with each
    token replaced by `<cas>`."""
    if name == "gets" and isinstance(result, tuple) and len(result) == 2:
        value, token = result
        if token is None:
            return [], result
        return [(None, token)], (value, "<cas>")
    if name == "gets_many" and isinstance(result, dict):
        pairs = [(k, token) for k, (_, token) in result.items()]
        return pairs, {k: (v, "<cas>") for k, (v, _) in result.items()}
    return [], result


def show(x, limit=120):
    text = repr(x)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


def show_call(name, args, kwargs):
    parts = [show(a, 60) for a in args] + [f"{k}={show(v, 40)}" for k, v in kwargs.items()]
    return f"{name}({', '.join(parts)})"


def allowed(name, args, kv, mc):
    """The allow-list: a reason for a known difference, or None. Empty: every difference
    fails the test."""
    return None


def run_seed(seed, kv_port, mc_port, ops, log):
    def client(port):
        # TCP_NODELAY: else a call after a `noreply` one waits for a delayed ACK (40 ms).
        return Client(("127.0.0.1", port), connect_timeout=5, timeout=5, no_delay=True,
                      default_noreply=False, serde=FlagsSerde())

    kv, mc = client(kv_port), client(mc_port)
    assert kv.flush_all(noreply=False) is True
    assert mc.flush_all(noreply=False) is True
    stream = Stream(seed)
    kv_to_mc, mc_to_kv = {}, {}
    diffs, allowed_counts = [], {}
    for i in range(ops):
        name, args, kv_kw, mc_kw = stream.call()
        kv_out = outcome(kv, name, args, dict(kv_kw))
        mc_out = outcome(mc, name, args, dict(mc_kw))
        kv_tokens, kv_shown = cas_tokens(name, kv_out)
        mc_tokens, mc_shown = cas_tokens(name, mc_out)
        same = kv_shown == mc_shown and len(kv_tokens) == len(mc_tokens)
        if same:
            for (key, k), (_, m) in zip(kv_tokens, mc_tokens):
                same &= kv_to_mc.setdefault(k, m) == m
                same &= mc_to_kv.setdefault(m, k) == k
                stream.cas_seen.setdefault(key or args[0], []).append((k, m))
        if log:
            print(f"OP {i} {show_call(name, args, mc_kw)} => {show(mc_shown)}")
        if same:
            continue
        reason = allowed(name, args, kv_out, mc_out)
        if reason:
            allowed_counts[reason] = allowed_counts.get(reason, 0) + 1
            continue
        diffs.append(
            f"seed {seed} op {i}: {show_call(name, args, kv_kw)}\n"
            f"  kvlab     {show(kv_out, 300)}\n"
            f"  memcached {show(mc_out, 300)}"
        )
        if len(diffs) >= MAX_DIFFS_PER_SEED:
            break
    kv.close()
    mc.close()
    return diffs, allowed_counts


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("kvlab_port", type=int)
    p.add_argument("memcached_port", type=int)
    p.add_argument("--ops", type=int, default=20_000)
    p.add_argument("--seed", type=int, action="append", default=[])
    p.add_argument("--log", action="store_true")
    a = p.parse_args()
    failed = False
    for seed in a.seed or [1]:
        diffs, allowed_counts = run_seed(seed, a.kvlab_port, a.memcached_port, a.ops, a.log)
        extra = "".join(f"; allowed {n}: {reason}" for reason, n in allowed_counts.items())
        print(f"seed {seed}: {a.ops} calls, {len(diffs)} differences{extra}")
        for d in diffs:
            print(d)
        failed |= bool(diffs)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
