// Package idemadapter is what framework adapters are built on: the pieces
// that turn a framework's request into a call of the idem engine and its
// answer back into the framework's response. It is for adapter authors; an
// application uses its framework's adapter (idemhttp, idemgin, idemecho,
// idemfiber, idemgrpc) and needs nothing from this package.
//
// The engine's own entry points stay in package idem, because the engine
// implements them: an adapter turns its request into an idem.Request, calls
// idem.Engine.Begin, runs the handler with the idem.Attempt's context and
// body while buffering its response, and hands the idem.Result to
// idem.Attempt.Finish, whose idem.Response it writes.
//
// For a framework built on net/http, [HandleHTTP] does all of that:
// [HTTPRequest] reads the request the way every adapter reads it, a pooled
// [ResponseBuffer] holds the response until the commit, and [WriteResponse]
// sends the answer. [Adapter] adds the application's principal function and
// the framework's route template. Adapters for other servers (fasthttp,
// gRPC) build the idem.Request themselves with [KeyField] and [ReadBody],
// and write a replay's headers after [ValidHeaderField].
//
// Package adaptertest is the suite every adapter passes.
package idemadapter
