#!/usr/bin/env python3
"""A consumer of KV events in vLLM's wire format, for kvtier's tests.

It uses only libzmq (pyzmq) and the msgpack package, and decodes what it
receives by the schema vLLM documents for its --kv-events-config stream
(vllm.distributed.kv_events: EventBatch, BlockStored, BlockRemoved,
AllBlocksCleared): messages [topic, 8-byte big-endian seq, EventBatch], a
batch [ts, events, (data_parallel_rank)], each event an array led by its
tag. It keeps the index a router would keep (the block hashes each medium
holds), asks the replay socket for what it missed, and, each time stdin
says "until N", prints its state as one JSON line once it has seen message
N (or, without a replay socket, after a gap, nothing more came for 5
seconds: N was lost too). It ends at the end of stdin.

usage: consumer.py PUB_ADDR REPLAY_ADDR|- TOPIC PAUSED

With PAUSED 1 it reads nothing (and lets libzmq queue one message at
most) until stdin says "go": a subscriber that falls behind.
"""
import json
import os
import sys
import time

import msgpack
import zmq

END = (1 << 64) - 1  # -1 as 8 unsigned bytes: the end of a replay


class Index:
    def __init__(self):
        self.media = {}  # medium -> {hash: [parent, token_ids, block_size]}
        self.last = -1
        self.gaps = []       # missed for good
        self.live_gaps = []  # missed on the live stream after its first message
        self.live = -1
        self.errors = []
        self.events = 0
        self.clears = 0
        self.replayed = 0

    def error(self, seq, msg):
        if len(self.errors) < 20:
            self.errors.append("message %d: %s" % (seq, msg))

    def apply(self, seq, payload):
        batch = msgpack.unpackb(payload, raw=False)
        if not isinstance(batch, list) or len(batch) not in (2, 3):
            return self.error(seq, "EventBatch is not [ts, events(, rank)]: %r" % (batch,))
        ts, events = batch[0], batch[1]
        if not isinstance(ts, float) or not isinstance(events, list):
            return self.error(seq, "EventBatch [ts, events] has types %s, %s" % (type(ts), type(events)))
        for ev in events:
            self.events += 1
            if not isinstance(ev, list) or not ev or not isinstance(ev[0], str):
                self.error(seq, "an event is not a tagged array: %r" % (ev,))
            elif ev[0] == "BlockStored":
                self.stored(seq, ev)
            elif ev[0] == "BlockRemoved":
                self.removed(seq, ev)
            elif ev[0] == "AllBlocksCleared":
                self.clears += 1
                self.media = {}
            else:
                self.error(seq, "unknown tag %r" % ev[0])
        self.last = seq

    def stored(self, seq, ev):
        # BlockStored: block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium
        if len(ev) < 7:
            return self.error(seq, "BlockStored has %d fields" % (len(ev) - 1))
        hashes, parent, tokens, size, lora, medium = ev[1:7]
        ok = (isinstance(hashes, list) and all(isinstance(h, int) for h in hashes)
              and (parent is None or isinstance(parent, int))
              and isinstance(tokens, list) and all(isinstance(t, int) for t in tokens)
              and isinstance(size, int) and (lora is None or isinstance(lora, int))
              and (medium is None or isinstance(medium, str)))
        if not ok or (tokens and len(tokens) != size * len(hashes)):
            return self.error(seq, "BlockStored fields of the wrong type or length: %r" % (ev,))
        m = self.media.setdefault(medium, {})
        for i, h in enumerate(hashes):
            if h in m and not self.gaps:  # after a gap the index may be stale
                self.error(seq, "block %x stored in %s twice" % (h, medium))
            p = parent if i == 0 else hashes[i - 1]
            m[h] = [p, tokens[i * size:(i + 1) * size], size]

    def removed(self, seq, ev):
        # BlockRemoved: block_hashes, medium
        if len(ev) < 3 or not isinstance(ev[1], list):
            return self.error(seq, "BlockRemoved malformed: %r" % (ev,))
        m = self.media.get(ev[2], {})
        for h in ev[1]:
            if h not in m and not self.gaps:  # after a gap the index may be stale
                self.error(seq, "block %x removed from %s where it was not" % (h, ev[2]))
            m.pop(h, None)


class Lines:
    """Lines of stdin read straight from its descriptor, so that polling it
    sees every line (sys.stdin's buffer would hide those read ahead)."""

    def __init__(self):
        self.buf = b""
        self.lines = []
        self.eof = False

    def fill(self):
        data = os.read(0, 4096)
        if not data:
            self.eof = True
        self.buf += data
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            self.lines.append(line.decode())

    def wait(self):
        """The next line, waiting for it; None at the end."""
        while not self.lines and not self.eof:
            self.fill()
        return self.lines.pop(0) if self.lines else None


def replay(sock, start, idx, upto):
    """Asks for every kept message from start on; applies those before upto."""
    sock.send_multipart([b"", start.to_bytes(8, "big")])
    while True:
        if not sock.poll(5000):
            idx.error(start, "no end of replay within 5 s")
            return
        frames = sock.recv_multipart()
        seq = int.from_bytes(frames[1], "big")
        if seq == END:
            return
        if idx.last < seq < upto:
            if seq != idx.last + 1:
                idx.gaps.append([idx.last + 1, seq - 1])
            idx.apply(seq, frames[2])
            idx.replayed += 1


def main():
    pub, replay_addr, topic, paused = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.RCVHWM, 1 if paused else 100000)
    sub.connect("tcp://" + pub)
    sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
    rep = None
    if replay_addr != "-":
        rep = ctx.socket(zmq.DEALER)
        rep.connect("tcp://" + replay_addr)
    print("subscribed", flush=True)
    stdin = Lines()
    if paused and stdin.wait() != "go":
        return
    idx = Index()
    until = None
    poller = zmq.Poller()
    poller.register(sub, zmq.POLLIN)
    poller.register(0, zmq.POLLIN)
    heard = time.monotonic()
    while True:
        if until is not None and idx.last >= until:
            report(idx)
            until = None
        elif until is not None and rep is not None and time.monotonic() - heard > 1:
            # Nothing live for a second: ask the replay socket.
            replay(rep, idx.last + 1, idx, until + 1)
            if idx.last < until:
                idx.gaps.append([idx.last + 1, until])
                idx.last = until
        elif until is not None and time.monotonic() - heard > 30:
            # Message until was lost too: nothing has come for 30 s (a
            # loaded machine may starve this process for seconds; tests
            # that drop messages end on one that is not dropped).
            idx.gaps.append([idx.last + 1, until])
            idx.last = until
        for sock, _ in poller.poll(100):
            if sock is sub:
                heard = time.monotonic()
                t, seq_b, payload = sub.recv_multipart()
                seq = int.from_bytes(seq_b, "big")
                if t != topic.encode() or seq <= idx.last:
                    continue
                if seq > idx.last + 1 and idx.live >= 0:
                    idx.live_gaps.append([idx.last + 1, seq - 1])
                idx.live = seq
                if seq > idx.last + 1 and rep is not None:
                    replay(rep, idx.last + 1, idx, seq)
                if seq > idx.last + 1:
                    idx.gaps.append([idx.last + 1, seq - 1])
                idx.apply(seq, payload)
            else:
                stdin.fill()
        if until is None and stdin.lines:
            until = int(stdin.lines.pop(0).split()[1])
            heard = time.monotonic()
        if until is None and stdin.eof:
            return


def report(idx):
    out = {"last": idx.last, "gaps": idx.gaps, "live_gaps": idx.live_gaps, "errors": idx.errors, "events": idx.events,
           "clears": idx.clears, "replayed": idx.replayed,
           "media": {m: {str(h): v for h, v in blocks.items()} for m, blocks in idx.media.items()}}
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
