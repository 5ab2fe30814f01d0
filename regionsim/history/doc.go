// Package history records what regionsim's workload asked idem and what it
// answered, one Op per call, with real-time call and return stamps, for the
// checkers in regionsim/check.
package history
