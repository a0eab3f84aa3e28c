// Package kvevents publishes a kvtier.Manager's block events in vLLM's wire
// format, so that a KV-aware router built for vLLM (one that indexes
// vLLM's --kv-events-config stream) indexes this server unchanged.
//
// The format: each message on a ZMQ PUB socket is three frames, the topic,
// an 8-byte big-endian sequence number (one more per message), and a
// msgpack EventBatch: the array [ts, events], ts in seconds since the
// epoch, each event an array led by its tag:
//
//	["BlockStored", [hash], parent hash or nil, [token ids], block size, nil, medium]
//	["BlockRemoved", [hash], medium]
//	["AllBlocksCleared"]
//
// with a block's hash its kvtier key and medium "GPU", "CPU" (the host
// tier), "DISK" (NVMe) or "REMOTE". A replay socket (ZMQ ROUTER) answers a
// request of an 8-byte big-endian sequence number with every kept message
// from it on, each as [seq, batch], and then [-1, empty].
//
// It promises: messages go out in the manager's event order; a subscriber
// whose connection cannot keep up loses whole messages (counted) and sees
// the gap in the sequence numbers, as does every subscriber when the
// publisher itself fell behind the manager's event ring; nothing here ever
// makes the manager wait. The sockets speak ZMTP 3.1 with the NULL
// mechanism over TCP (zmtp.go), written here to keep the module free of a
// ZMQ dependency and its per-subscriber blocking.
package kvevents
