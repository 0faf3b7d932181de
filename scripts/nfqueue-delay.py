#!/usr/bin/env python3
"""Delays packets by a fixed time in user space, for kernels built without `sch_netem`.

`scripts/cluster-netns.sh netem NODE delay 20ms` uses `tc qdisc ... netem` where the kernel
has it. Where it does not, the script queues the node's outgoing packets to NFQUEUE
(`iptables -A OUTPUT -o eth0 -j NFQUEUE --queue-num Q --queue-bypass`, inside the node's
network namespace) and runs this program in that namespace: it receives each packet's id
over netlink (metadata only, no payload copy), holds it for the delay and then accepts it.
Packets leave in the order they came, each `--delay-ms` later than it would have; the
kernel's queue holds them meanwhile. With `--queue-bypass` the packets flow undelayed if
this program is gone, so a killed delayer never cuts a node off.

Standard library only (raw netlink), Linux only. Runs until SIGTERM/SIGINT, or for at most
--max-seconds.
"""

import argparse
import errno
import heapq
import os
import select
import signal
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET = 0
NFQNL_MSG_VERDICT_BATCH = 3
NFQNL_MSG_CONFIG = 2
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQA_CFG_QUEUE_MAXLEN = 3
NFQA_CFG_MASK = 4
NFQA_CFG_FLAGS = 5
NFQA_CFG_F_GSO = 4
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NF_ACCEPT = 1
NLM_F_REQUEST = 1
NLM_F_ACK = 4
NLMSG_ERROR = 2
NLMSG_HDR = struct.Struct("=IHHII")
NFGENMSG = struct.Struct("=BBH")


def attr(kind, payload):
    size = 4 + len(payload)
    return struct.pack("=HH", size, kind) + payload + b"\0" * ((4 - size % 4) % 4)


class Queue:
    def __init__(self, num):
        self.num = num
        self.seq = 0
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.sock.bind((0, 0))

    def send(self, msg, attrs, ack=False):
        self.seq += 1
        body = NFGENMSG.pack(socket.AF_UNSPEC, 0, socket.htons(self.num)) + b"".join(attrs)
        flags = NLM_F_REQUEST | (NLM_F_ACK if ack else 0)
        kind = (NFNL_SUBSYS_QUEUE << 8) | msg
        self.sock.send(NLMSG_HDR.pack(NLMSG_HDR.size + len(body), kind, flags, self.seq, 0) + body)
        if ack:
            self.expect_ack()

    def expect_ack(self):
        data = self.sock.recv(65536)
        length, kind, _, _, _ = NLMSG_HDR.unpack_from(data)
        if kind == NLMSG_ERROR:
            (code,) = struct.unpack_from("=i", data, NLMSG_HDR.size)
            if code != 0:
                raise OSError(-code, f"nfqueue config: {os.strerror(-code)}")

    def bind(self, maxlen):
        cmd = struct.pack("!BBH", NFQNL_CFG_CMD_BIND, 0, socket.AF_UNSPEC)
        self.send(NFQNL_MSG_CONFIG, [attr(NFQA_CFG_CMD, cmd)], ack=True)
        self.send(NFQNL_MSG_CONFIG, [attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META))], ack=True)
        self.send(NFQNL_MSG_CONFIG, [attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", maxlen))], ack=True)
        # GSO packets queued whole instead of segmented first: fewer messages, same bytes.
        flags = struct.pack("!I", NFQA_CFG_F_GSO)
        self.send(NFQNL_MSG_CONFIG, [attr(NFQA_CFG_MASK, flags), attr(NFQA_CFG_FLAGS, flags)], ack=True)

    def packets(self):
        """Packet ids of the messages waiting now (non-blocking)."""
        ids = []
        while True:
            try:
                data = self.sock.recv(1 << 16, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return ids
            except OSError as e:
                if e.errno == errno.ENOBUFS:  # the socket overflowed; the kernel drops those
                    continue
                raise
            off = 0
            while off + NLMSG_HDR.size <= len(data):
                length, kind, _, _, _ = NLMSG_HDR.unpack_from(data, off)
                if length < NLMSG_HDR.size:
                    break
                if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
                    a = off + NLMSG_HDR.size + NFGENMSG.size
                    while a + 4 <= off + length:
                        alen, akind = struct.unpack_from("=HH", data, a)
                        if alen < 4:
                            break
                        if akind & 0x7FFF == NFQA_PACKET_HDR:
                            (pid,) = struct.unpack_from("!I", data, a + 4)
                            ids.append(pid)
                        a += (alen + 3) & ~3
                off += (length + 3) & ~3

    def accept_upto(self, pid):
        """Accepts every queued packet with an id up to `pid` (one batch verdict)."""
        self.send(NFQNL_MSG_VERDICT_BATCH, [attr(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, pid))])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--queue", type=int, default=0)
    p.add_argument("--delay-ms", type=float, required=True)
    p.add_argument("--max-seconds", type=float, default=3600.0)
    p.add_argument("--maxlen", type=int, default=8192)
    args = p.parse_args()
    delay = args.delay_ms / 1000.0
    stop = [False]
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda *_: stop.__setitem__(0, True))
    q = Queue(args.queue)
    q.bind(args.maxlen)
    print(f"nfqueue-delay: queue {args.queue}, {args.delay_ms} ms", flush=True)
    end = time.monotonic() + args.max_seconds
    held = []  # (due, id): ids arrive in order, so the heap is a FIFO
    while not stop[0] and time.monotonic() < end:
        now = time.monotonic()
        timeout = max(0.0, held[0][0] - now) if held else 0.5
        try:
            select.select([q.sock], [], [], timeout)
        except InterruptedError:
            continue
        now = time.monotonic()
        for pid in q.packets():
            heapq.heappush(held, (now + delay, pid))
        last = None
        while held and held[0][0] <= now:
            last = heapq.heappop(held)[1]
        if last is not None:
            q.accept_upto(last)
    # Release what is still held, then exit (the rule's --queue-bypass covers the rest).
    if held:
        q.accept_upto(max(pid for _, pid in held))
    return 0


if __name__ == "__main__":
    sys.exit(main())
