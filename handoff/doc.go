// Package handoff decides the steps of moving a batch of ring partitions
// from one shard's Raft group to another's while a topology change runs:
// the driver (the meta group's leader) observes the meta group's record of
// the batch and each group's partition table, and Next turns that
// observation into one typed step (choose a batch, record a new attempt,
// move, record the batch as moved, wait). Next does no I/O, so every
// decision is tested without processes; the node executes the steps.
//
// Safety does not rest on the driver being right: every step it takes is
// fenced by the state machines (fsm's handoff commands carry the attempt,
// and a group refuses a step of an attempt older than the one that holds a
// partition, an open whose digest differs from what was imported, a freeze
// of an earlier epoch). The explorer in this package's tests runs drivers
// that crash, are deposed and retry, over the real state machines with
// independently cut apply batches, and checks that no acknowledged record is
// lost and no key gets two owners; fsm/DESIGN.md ("Fenced attempts") gives
// the argument.
package handoff
