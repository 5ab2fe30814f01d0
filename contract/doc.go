// Package contract is the one home of the public API's rules (docs/api.md):
// the name grammar, the key and owner-token byte rules, the owner-token
// generator, every limit, the public error codes and the reserve outcomes.
//
// It imports only the standard library, so that every layer (server, client,
// the HTTP engine, the router, idemctl) can check a request against the same
// rule without linking the others. Each layer wraps its own message around
// the one check: the checks here return a *Violation that says which rule
// broke and where, and leave the wording to the caller.
//
// The gRPC status code of each Code lives next to the proto conversion
// (api/idem/v1, GRPCCode), so that this package stays free of grpc.
package contract
