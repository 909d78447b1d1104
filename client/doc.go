// Package idemclient is the client half of idempotency keys: an
// http.RoundTripper that gives each POST and PATCH one Idempotency-Key and
// retries it safely, with that same key, until the server's answer is
// final. It speaks the IETF draft's header, so it works with idem and with
// any server that deduplicates by it (Stripe-style), and needs nothing but
// the standard library.
//
// # Set-up
//
//	rt, err := idemclient.New(idemclient.Config{}) // defaults: POST and PATCH, 5 attempts, 30s
//	client := &http.Client{Transport: rt}
//
// Then use client as any *http.Client. New validates the Config at start-up
// and returns an error wrapping [ErrInvalidConfig] naming each bad field.
//
// # What it guarantees
//
// One request — one call of Do — sends one key on every attempt: the
// request's own key header (Idempotency-Key, or [Config.Header]) if it has
// one, else the key [WithKey] put in its context, else a new random key
// ([NewKey], a UUIDv4) drawn once, before the first attempt. A retry after
// a lost connection or a 503 therefore reaches the server as the same
// operation, and the server runs it at most once; minting a key per
// attempt, a known bug of SDKs, would turn every retry into a new charge.
// To keep one key across calls of Do (your own retry loop, or a retry
// after your process restarted), store a key and pass it with WithKey
// every time. A redirect that http.Client follows (a 307 or 308, which
// resend the body) is the same operation sent to another URL, and keeps
// the key.
//
// It retries after transport errors (when the body can be sent again), 409
// while another attempt with the key is running, 429, 502, 503, 504 and 500
// unless the problem type says retrying cannot help, honouring Retry-After
// up to a cap and otherwise backing off exponentially with full jitter,
// within an attempts budget, a time budget and the context's deadline. It
// never retries 422 (the key was used for another request), any other 4xx,
// or a replayed answer. A problem whose type ends in "outcome-unknown"
// (the server does not know whether the operation took effect) is never
// retried either: the request fails with [ErrOutcomeUnknown], for an
// operator to resolve. [Transport] lists the rules exactly.
//
// # What the caller learns
//
// [Info] returns the key that was sent, how many attempts it took, and
// whether the answer was replayed (Idempotent-Replayed: true), so that an
// application can log the key next to the outcome. A request that ends
// without an answer returns an [*Error] with the same key and attempts; its
// message names the key by a hash, never the key itself.
package idemclient
