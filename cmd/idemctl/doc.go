// Command idemctl is the operator's tool for an idem cluster. It talks to
// the nodes' gRPC ports: the Admin service (Status, TransferLeader,
// Snapshot, ReplaceVoter, the operator actions on keys and the namespace
// policies) that every idemnode serves next to the public API, and the
// public Idempotency service for reads.
//
//	idemctl --config cluster.yaml status
//	idemctl --config cluster.yaml locate payments order-42
//	idemctl --config cluster.yaml get payments order-42
//	idemctl get payments order-42 --addr 127.0.0.1:7090      # through a router (or any node)
//	idemctl --config cluster.yaml transfer-leader us-east-0 us-east-2
//	idemctl --config cluster.yaml snapshot us-east-0 --node us-east-3
//	idemctl --config cluster.yaml status --json | jq '.shards[] | {id, leader}'
//	idemctl --config cluster.yaml namespaces set-policy payments --max-lease-ms 60000 --tombstone-s 86400
//	idemctl --config cluster.yaml replace-node --id us-east-3 --data-dir /var/lib/idem/us-east-3
//
// # Commands
//
//	status                               every node's health (ready, not ready, unreachable), version and
//	                                     shard counts; per shard its leader and each replica's Raft state,
//	                                     term, commit, applied and last log index and records
//	locate NAMESPACE KEY                 the key's shard and home region (computed from the topology file,
//	                                     as every node and router does), its voters and current leader
//	get NAMESPACE KEY [--addr HOST:PORT] the key's record, read linearizably over gRPC from --addr or from
//	                                     the topology's nodes (the key's voters first); never the owner token
//	transfer-leader SHARD [TARGET_NODE]  asks the shard's leader to hand over to TARGET_NODE (a voter), or to
//	                                     the voter Raft picks, and waits until the new leader is seen
//	snapshot SHARD [--node ID]           a Raft snapshot of the shard now, on its leader or on voter --node
//	namespaces set-policy NS [FLAGS]     replaces namespace NS's policy (--default-lease-ms, --max-lease-ms,
//	                                     --default-retention-s, --max-retention-s, --tombstone-s; a flag not
//	                                     given takes the built-in default) and prints the policy in force
//	namespaces get-policy NS             the policy in force for NS, every field filled in
//	replace-node --id NODE [--data-dir D] a stopped node whose data dir was lost: empties the dir, marks it
//	                                     to rejoin, and has each of its shards' leaders remove and re-add it
//	                                     (Admin.ReplaceVoter); started again, it catches up from its peers
//
// Every command takes --config FILE (the topology file, the same as the
// nodes'; required except for get with --addr), --json and --timeout D (the
// deadline of each call to a node, default 5s), before or after the command
// name; "--" ends the flags, for keys that start with "-". --help works
// globally and per command ("idemctl get --help").
//
// # Output and exit status
//
// Tables aligned for people by default. --json prints one JSON document per
// run, with snake_case fields; get --json prints the JSON API's GET body
// (fencing token as a decimal string, times RFC 3339 UTC, body base64).
// Unreachable nodes are part of the answer, not a failure: status exits 0
// and shows them as "unreachable" as long as one node answered. Any failure
// (bad arguments, an unknown shard or a non-voter target, no node
// answering, a key with no record, a refused transfer or snapshot) exits 1
// with one line on stderr.
package main
