// Package statedb keeps the records of every shard a node hosts on disk, in
// one embedded pebble engine per node (a key prefix per shard), behind
// package fsm's Store seam. It also adapts an fsm.FSM over such a store to
// raftstore's DurableStateMachine: the applied Raft index is written in the
// same engine batch as the records it covers, so a restart neither restores a
// snapshot nor re-applies the log.
//
// See DESIGN.md for the layout, the durability reasoning and the figures.
package statedb
